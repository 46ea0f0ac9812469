import ForgePushToken
import Foundation

// Helpers every test target shares (a target of its own, so that no test target copies them).
#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif
#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A seeded random source (SplitMix64, Steele, Lea and Flood 2014, as Java's `SplittableRandom`):
/// the same seed gives the same values on every run and platform, so a failing random input can be
/// repeated. Tests print or name their seed.
public struct SeededGenerator: RandomNumberGenerator {
    /// The generator's state: the seed at first.
    public var state: UInt64

    /// A generator starting at `state`.
    public init(state: UInt64) {
        self.state = state
    }

    /// The next 64 random bits.
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var mixed = state
        mixed = (mixed ^ (mixed >> 30)) &* 0xBF58_476D_1CE4_E5B9
        mixed = (mixed ^ (mixed >> 27)) &* 0x94D0_49BB_1331_11EB
        return mixed ^ (mixed >> 31)
    }
}

/// A log handler that discards everything.
public let quiet: PushTokenManager.LogHandler = { _, _ in }

/// Records the messages a `PushTokenManager` (or anything with its log handler) logs.
public final class LogRecorder: Sendable {
    /// One message.
    public struct Entry: Equatable, Sendable {
        public var level: PushTokenManager.LogLevel
        public var message: String

        public init(level: PushTokenManager.LogLevel, message: String) {
            self.level = level
            self.message = message
        }
    }

    private let entries = Locked<[Entry]>([])

    public init() {}

    /// The handler to give the code under test.
    public var handler: PushTokenManager.LogHandler {
        { [entries] level, message in
            entries.withLock { $0.append(Entry(level: level, message: message)) }
        }
    }

    /// Everything recorded so far, in order.
    public var recorded: [Entry] {
        entries.withLock { $0 }
    }
}

/// A thread-safe counter, for counting `wake` calls.
public final class Counter: Sendable {
    private let storage = Locked(0)

    public init() {}

    public func increment() {
        storage.withLock { $0 += 1 }
    }

    public var value: Int {
        storage.withLock { $0 }
    }
}

/// Runs `body(i)` for `i` in `0..<count`, each on its own new thread, and returns when all have
/// finished, without blocking a cooperative thread.
public func runOnThreads(_ count: Int, _ body: @escaping @Sendable (Int) -> Void) async {
    await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
        let remaining = Locked(count)
        for index in 0..<count {
            let thread = Thread {
                body(index)
                if remaining.withLock({
                    $0 -= 1
                    return $0
                }) == 0 {
                    done.resume()
                }
            }
            thread.start()
        }
    }
}

/// Waits until `condition` holds, looking every millisecond; returns whether it held.
///
/// For conditions that something already set in motion must make true (a server releasing a
/// departed subscriber, a log line written after an answer): the test waits for the event itself
/// and asserts no timing. `hangGuard` (seconds) only keeps a broken build from hanging the run; it
/// is far above any wait the code can cause under load (the suites run in parallel, three times,
/// under the sanitizers, on two cores: a release that takes 5 ms alone took over 2 s under Thread
/// Sanitizer, issue 22). Timing contracts, such as "released within 2 seconds", are checked
/// against the release binary in e2e/, where timing can be trusted.
/// `ContinuousClock` needs macOS 13 / iOS 16 / tvOS 16 / watchOS 9; the server suites that call
/// this run on Linux.
@available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
public func eventually(hangGuard seconds: Double = 60, _ condition: () -> Bool) -> Bool {
    let deadline = ContinuousClock.now + .milliseconds(Int(seconds * 1000))
    while ContinuousClock.now < deadline {
        if condition() { return true }
        usleep(1_000)
    }
    return condition()
}

/// Why a test-support helper could not do its work.
public struct TestSupportError: Error, CustomStringConvertible {
    public let description: String
}

/// A TCP port on 127.0.0.1 that nothing listens on now (bound to port 0, read, released), for a
/// server a test starts (ours, Redis).
public func freeLoopbackPort() throws -> Int {
    // Glibc imports SOCK_STREAM as an enum case (`__socket_type`), Darwin as an Int32.
    #if canImport(Glibc)
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    #else
        let fd = socket(AF_INET, SOCK_STREAM, 0)
    #endif
    guard fd >= 0 else { throw TestSupportError(description: "socket() failed: \(errno)") }
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = 0
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) { pointer in
        pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { address in
            bind(fd, address, length) == 0 && getsockname(fd, address, &length) == 0
        }
    }
    guard bound else { throw TestSupportError(description: "bind() failed: \(errno)") }
    return Int(UInt16(bigEndian: address.sin_port))
}

/// Runs the program at `path` with `arguments` and returns everything it wrote to standard output
/// once it has exited.
public func standardOutput(of path: String, arguments: [String]) throws -> Data {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: path)
    process.arguments = arguments
    let pipe = Pipe()
    process.standardOutput = pipe
    try process.run()
    let output = pipe.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    return output
}

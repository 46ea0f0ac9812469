import Dispatch
import ForgePushToken
import Foundation
import Testing

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

/// How long ``waitUntil(_:within:sourceLocation:_:)`` waits before it fails the test, in seconds:
/// 120, or `FORGE_TEST_WAIT_SECONDS` from the environment.
///
/// Only a bound against a hang, never a deadline the code under test is meant to meet
/// (docs/testing.md, "Waiting in tests"): `swift test` runs the suites in parallel, under Thread
/// and Address Sanitizer too, on two shared cores, where a release that takes 5 ms alone took over
/// 2 s (issue 22) and a whole library suite up to 115 s (issue 31). Two minutes for one event is
/// far above that, and below the library suites' 10-minute time limit, so a lost event fails with
/// this bound's message rather than the time limit's.
public let waitBoundSeconds: Double = {
    if let text = ProcessInfo.processInfo.environment["FORGE_TEST_WAIT_SECONDS"], let seconds = Double(text),
        seconds > 0
    {
        return seconds
    }
    return 120
}()

/// Seconds on a monotonic clock (Dispatch's uptime; no `Clock`, so that the library's suites,
/// which build for macOS 12, can call the wait too).
private func uptimeSeconds() -> Double {
    Double(DispatchTime.now().uptimeNanoseconds) / 1e9
}

/// The failure of a wait: names what it waited for, and for how long.
private func recordGivingUp(_ what: String, after seconds: Double, sourceLocation: SourceLocation) {
    Issue.record(
        "waited \(Int(seconds.rounded())) s (waitBoundSeconds) for \(what), in vain", sourceLocation: sourceLocation)
}

/// The tests' one wait: returns once `condition` holds, looking every millisecond; fails the test
/// with a message naming `what` if it does not hold within `seconds` (``waitBoundSeconds`` unless
/// told), and never hangs.
///
/// For conditions that something already set in motion must make true (a server releasing a
/// departed subscriber, a log line written after an answer, a metric counted after a reload): the
/// test waits for the event itself and asserts no timing (docs/testing.md, "Waiting in tests").
/// Timing contracts, such as "released within 2 seconds", are checked against the release binary
/// in e2e/, where timing can be trusted. This form blocks its thread: async code gets the other.
///
/// - Parameters:
///   - what: What the test waits for, in the failure's message (the condition's text will do).
///   - seconds: The bound.
///   - condition: Evaluated on the calling thread until it returns `true`; an error it throws ends
///     the wait and is rethrown.
/// - Returns: Whether `condition` held (the test has already failed if not).
@_disfavoredOverload  // in async code, the suspending form below, even for a condition that is not async
@discardableResult
public func waitUntil(
    _ what: @autoclosure () -> String,
    within seconds: Double = waitBoundSeconds,
    sourceLocation: SourceLocation = #_sourceLocation,
    _ condition: () throws -> Bool
) rethrows -> Bool {
    let deadline = uptimeSeconds() + seconds
    while true {
        if try condition() { return true }
        if uptimeSeconds() > deadline { break }
        usleep(1_000)
    }
    if try condition() { return true }
    recordGivingUp(what(), after: seconds, sourceLocation: sourceLocation)
    return false
}

/// The tests' one wait, for async code: as the blocking form, but suspends between looks
/// (yielding at first, so that tasks on a manual clock run on at once, then sleeping a
/// millisecond), and fails as soon as the task is cancelled (as a time limit does). It runs on
/// the caller's actor (`isolation`), so the condition may read what that actor protects.
@discardableResult
public func waitUntil(
    _ what: @autoclosure () -> String,
    within seconds: Double = waitBoundSeconds,
    isolation: isolated (any Actor)? = #isolation,
    sourceLocation: SourceLocation = #_sourceLocation,
    _ condition: () async throws -> Bool
) async rethrows -> Bool {
    let start = uptimeSeconds()
    while true {
        if try await condition() { return true }
        let now = uptimeSeconds()
        if now > start + seconds { break }
        if Task.isCancelled {
            Issue.record("cancelled while waiting for \(what())", sourceLocation: sourceLocation)
            return false
        }
        if now - start < 0.01 {
            await Task.yield()
        } else {
            try? await Task.sleep(nanoseconds: 1_000_000)
        }
    }
    if try await condition() { return true }
    recordGivingUp(what(), after: seconds, sourceLocation: sourceLocation)
    return false
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

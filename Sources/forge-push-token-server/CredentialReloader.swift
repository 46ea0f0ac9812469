import Dispatch
import ForgePushToken
import HTTPServing
import ServerSupport
import TokenService

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// Reads the token files again (docs/operations.md, "Rotating tokens"): on `SIGHUP` (`reload(because:)`
/// from the main thread's `sigwait`), and whenever `stat(2)`, following links, sees a file's
/// device, inode, size or modification time change, checked every `pollInterval`. A Kubernetes
/// Secret volume is updated by swapping its `..data` link, which changes the inode the file's
/// path leads to, and nothing signals the process.
///
/// A reload that reads both files and parses them (`TokenFile.parse`) puts the new sets in force
/// (`Responder.replaceCredentials(_:)`, which ends the streams whose token was removed) and counts
/// `result="ok"`. Any failure (an unreadable, vanished, or invalid file) logs one error line
/// naming the file and the reason, never a token, counts `result="failed"`, and leaves the sets in
/// force: the service never falls back to open access. A file that keeps failing is not logged
/// again until it changes.
///
/// Thread-safety: `Sendable`; every reload and poll runs on one serial queue, in order.
final class CredentialReloader: Sendable {
    /// What `stat(2)` says of a file: its identity and version, or the error that stopped it.
    enum Signature: Equatable, Sendable {
        case file(device: UInt64, inode: UInt64, size: Int64, seconds: Int, nanoseconds: Int)
        case unreadable(errno: Int32)

        /// The signature of `path`, links followed.
        init(path: String) {
            var status = stat()
            guard stat(path, &status) == 0 else {
                self = .unreadable(errno: errno)
                return
            }
            self = .file(
                device: UInt64(status.st_dev), inode: UInt64(status.st_ino), size: Int64(status.st_size),
                seconds: status.st_mtim.tv_sec, nanoseconds: status.st_mtim.tv_nsec)
        }
    }

    /// How often the files are looked at (the contract asks for at least every 10 s).
    static let pollInterval = DispatchTimeInterval.seconds(1)

    private let writePath: String
    private let readPath: String?
    private let responder: Responder
    private let log: ServerLog
    private let readFile: @Sendable (String) throws -> String
    private let queue = DispatchQueue(label: "forge-push-token.credentials")
    /// The files' signatures when they were last read (only touched on `queue`).
    private let seen: Locked<[Signature]>
    /// Set by `stop()`: the poll does not come back.
    private let stopped = Locked(false)

    /// A reloader of `writePath` (and `readPath`) into `responder`, whose files were read at start
    /// with `readFile`. `signatures` are the files' signatures taken just before that read
    /// (`CommandLineOptions.tokenFileSignatures`), so a change during it is reloaded by the first
    /// poll; `nil` takes them now.
    init(
        writePath: String, readPath: String?, responder: Responder, log: ServerLog,
        signatures: [Signature]? = nil,
        readFile: @escaping @Sendable (String) throws -> String = CommandLineOptions.readTextFile
    ) {
        self.writePath = writePath
        self.readPath = readPath
        self.responder = responder
        self.log = log
        self.readFile = readFile
        self.seen = Locked(signatures ?? [writePath, readPath].compactMap { $0 }.map(Signature.init(path:)))
    }

    /// Starts looking at the files every `pollInterval`.
    func start() {
        queue.asyncAfter(deadline: .now() + Self.pollInterval) { [self] in poll() }
    }

    /// Stops the poll (a reload already queued still runs). For tests: the service polls until it
    /// exits.
    func stop() {
        stopped.withLock { $0 = true }
    }

    /// Reads the files again now (on the reloader's queue), whether they changed or not; `cause`
    /// goes into the log line (`SIGHUP`).
    func reload(because cause: String) {
        queue.async { [self] in reloadNow(because: cause) }
    }

    private var paths: [String] { [writePath, readPath].compactMap { $0 } }

    private func poll() {
        guard !stopped.withLock({ $0 }) else { return }
        let now = paths.map(Signature.init(path:))
        if now != seen.withLock({ $0 }) {
            reloadNow(because: "a token file changed")
        }
        queue.asyncAfter(deadline: .now() + Self.pollInterval) { [self] in poll() }
    }

    /// Reads both files and puts their tokens in force, or logs and counts why not.
    private func reloadNow(because cause: String) {
        // Taken before reading: a change while reading is seen by the next poll.
        let signatures = paths.map(Signature.init(path:))
        seen.withLock { $0 = signatures }
        let metrics = responder.metrics
        do throws(CommandLineOptions.UsageError) {
            let write = try CommandLineOptions.readTokenFile(writePath, flag: .writeTokenFile, readFile: readFile)
            let read = try readPath.map { path throws(CommandLineOptions.UsageError) in
                try CommandLineOptions.readTokenFile(path, flag: .readTokenFile, readFile: readFile)
            }
            guard let policy = BearerAuthentication(writeTokens: write, readTokens: read),
                let ended = responder.replaceCredentials(policy)
            else {
                throw CommandLineOptions.UsageError(description: "the files do not make the service's kind of policy")
            }
            // Logged, then counted: whoever sees the count (a probe, a test) finds the line.
            log.log(
                .info,
                "credentials reloaded (\(cause)): \(policy.tokenCount(.write)) write and "
                    + "\(policy.tokenCount(.read)) read tokens in force; \(ended) event streams with a removed token ended"
            )
            metrics.increment(.credentialReloadsOK)
        } catch {
            log.log(.error, "credentials reload failed (\(cause)): \(error); the tokens in force stay")
            metrics.increment(.credentialReloadsFailed)
        }
    }
}

import CMicroHTTPD
import Dispatch
import ForgePushToken
import HTTPServing
import ServerSupport
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// The HTTP/1.1 engine: libmicrohttpd daemons in front of an `HTTPApplication`.
///
/// `configuration.threads` libmicrohttpd daemons in epoll mode with `MHD_ALLOW_SUSPEND_RESUME`
/// share the listening socket, each run by its own `DaemonLoop` thread: an event-stream connection
/// with nothing to send is suspended and costs no CPU until a new event, a heartbeat or its
/// client's departure resumes it. Data walks one way: libmicrohttpd's thread → this adapter →
/// `Application` (the service's `Responder`, and what lies behind it) → each stream's connection,
/// resumed by this adapter (docs/architecture.md, "The path of a request").
///
/// Generic over its application, so every call into it is specialised, with no existential; the
/// engine knows only `HTTPApplication` (docs/architecture.md, "Replacing the engine").
///
/// Lifecycle: `start()` once, then `Service.shutdown(engine:)` once, which calls this server's
/// `ServiceEngine` steps (`quiesce()`, `awaitIdle()`, `stop()`) in its order; the server must stay
/// alive in between (libmicrohttpd's callbacks hold an unretained reference to it).
///
/// Thread-safety: `start()` and the shutdown steps may be called from any thread, one after the
/// other.
public final class MicroHTTPDServer<Application: HTTPApplication>: ServiceEngine {
    /// The configuration the server was created with.
    public let configuration: ServerConfiguration
    /// What the engine serves.
    public let application: Application
    let log: ServerLog
    /// What the application said of itself at start (`HTTPApplication.traits`, read once).
    let traits: HTTPApplicationTraits
    /// The application as `HTTPCachedReads`, when it is one and names a cached read's path
    /// (`HTTPApplicationTraits.cachedReadPath`): asked once, at start.
    let cachedReader: (any HTTPCachedReads)?
    let watcher: SubscriberWatcher
    /// The cached read's response for the current version (`HTTPCachedReads.cachedRead()`).
    let cachedReads = CachedReadCache()
    /// Requests that reached the access handler and have not completed, streams included: an
    /// atomic, not a lock, because every request on every daemon thread counts itself in and out.
    let inFlight = Atomic<Int>(0)
    /// Event streams whose response has not been freed yet (`EventStream`).
    let openStreams = Locked(0)
    /// The pending answers whose connections are suspended (`Daemon.answer`), answered by
    /// `stop()` before libmicrohttpd stops.
    let parked = Locked(ParkedResponses())
    /// Open connections, in all and per client address, against the configured limits.
    let limiter: ConnectionLimiter
    /// Copies a connection's socket for a detached stream (`copyDescriptor` outside tests, which
    /// give one that fails to check the `503` a failed copy gets): a descriptor, or -1 with `errno`.
    let copySocket: @Sendable (Int32) -> Int32
    /// The pace of the refused connections' log lines (`LogRateLimiter`): a flood of them logs
    /// one line per 10 s, with how many were left out.
    private let refusalWarnings = Locked(LogRateLimiter())
    private let running = Locked<Running?>(nil)
    /// Whether `quiesce()` has closed the listening socket.
    private let quiesced = Locked(false)

    /// What exists between `start()` and `shutdown()`.
    struct Running: Sendable {
        let daemons: [DaemonHandle]
        let contexts: [Daemon<Application>]
        let loggers: [LoggerHandle]
        let credentials: TLSMemory?
        let authority: String
    }

    /// Creates a server for `application`. Nothing listens before `start()`.
    /// - Throws: `ServerError.socket` when the subscriber watcher's epoll set cannot be made.
    public convenience init(
        configuration: ServerConfiguration, application: Application, log: ServerLog
    ) throws(ServerError) {
        try self.init(configuration: configuration, application: application, log: log, copySocket: copyDescriptor)
    }

    /// A server whose detached streams' sockets are copied by `copySocket` (tests: a copy that
    /// fails); otherwise as `init(configuration:application:log:)`.
    init(
        configuration: ServerConfiguration, application: Application, log: ServerLog,
        copySocket: @escaping @Sendable (Int32) -> Int32
    ) throws(ServerError) {
        self.copySocket = copySocket
        self.configuration = configuration
        self.application = application
        self.log = log
        let traits = application.traits
        self.traits = traits
        self.cachedReader = traits.cachedReadPath == nil ? nil : application as? any HTTPCachedReads
        self.watcher = try SubscriberWatcher(
            ticks: application as? any HTTPTicks, heartbeatSeconds: configuration.heartbeatSeconds,
            wantsTicks: traits.wantsTicks, clock: configuration.clock)
        let files = Self.raiseFileLimit(log: log)
        // Each connection holds a descriptor; some are the service's own (listening socket, epoll
        // sets, eventfds, the state file, standard streams). Over the file limit, libmicrohttpd
        // would stop accepting altogether instead of refusing the surplus.
        let usable = files.map { max(1, Int(clamping: $0) - reservedDescriptors) }
        var limit = configuration.connectionLimit
        if let usable, let files, limit > usable {
            log.log(
                .warning,
                "--max-connections \(limit) is over what the open-file limit (\(files)) allows;"
                    + " using \(usable) (raise it with ulimit -n or the container's nofile limit)")
            limit = usable
        }
        self.limiter = ConnectionLimiter(maxTotal: limit, maxPerAddress: configuration.maxConnectionsPerAddress)
    }

    /// Logs that connections are being refused because `reason`, at most once per 10 seconds
    /// (`LogRateLimiter`), with how many such lines were left out.
    func warnOfRefusals(_ reason: String) {
        let now = configuration.clock.now
        guard let leftOut = refusalWarnings.withLock({ $0.admit("refused", at: now) }) else { return }
        log.log(.warning, LogRateLimiter.annotate("refusing new connections: \(reason)", leftOut: leftOut))
    }

    /// Binds the address, starts libmicrohttpd and the stream machinery, and logs
    /// `listening on http://HOST:PORT` (`https://` with TLS credentials) with the real port.
    ///
    /// `init` has raised the process's soft `RLIMIT_NOFILE` to its hard limit, and lowered the
    /// connection limit to fit it (with a warning) when it would not.
    /// - Returns: the bound address as a URL authority, `HOST:PORT` (IPv6 in brackets).
    /// - Throws: `ServerError` (`.addressInUse` for a busy port).
    @discardableResult
    public func start() throws(ServerError) -> String {
        let socket = try ListeningSocket.bind(host: configuration.host, port: configuration.port)
        // One logger per daemon, so that each knows the hand-over lines its own daemon is about
        // to log (`LogBox.expectHandOverLine`); one warning budget for them all.
        let warnings = Locked(LineBudget())
        var loggers: [LoggerHandle] = []
        // No MHD_USE_INTERNAL_POLLING_THREAD: each daemon is driven by a DaemonLoop (see there why).
        var flags = MHD_USE_EPOLL.rawValue | MHD_ALLOW_SUSPEND_RESUME.rawValue | MHD_USE_ERROR_LOG.rawValue
        if socket.isIPv6 { flags |= MHD_USE_IPv6.rawValue }
        // Without it libmicrohttpd half-closes (`shutdown(SHUT_WR)`) every connection it closes,
        // a handed-over stream's included: its client would see a FIN right after the head
        // (libmicrohttpd 0.9.75, connection.c, `MHD_connection_mark_closed_`). Daemon-wide: no
        // connection is half-closed before its close, and new ones are read at once.
        if detachesStreams { flags |= MHD_USE_TURBO.rawValue }
        var options = [
            // The limiter (mhdAcceptPolicy) enforces the limit across all daemons; libmicrohttpd's
            // own per-daemon limit is set above it so that it never refuses first.
            MHD_OptionItem(option: .CONNECTION_LIMIT, value: limiter.maxTotal + 16, ptr_value: nil),
            MHD_OptionItem(
                option: .CONNECTION_MEMORY_LIMIT, value: configuration.connectionMemoryLimit, ptr_value: nil),
            // Ordinary connections idle longer than this are closed; event streams opt out (see
            // openStream), which also puts them on the list libmicrohttpd's epoll loop visits in full.
            MHD_OptionItem(option: .CONNECTION_TIMEOUT, value: configuration.idleTimeoutSeconds, ptr_value: nil),
        ]
        // The PEM texts stay allocated until the daemons have stopped (libmicrohttpd keeps the
        // pointers it is given).
        let credentials = configuration.tls.map { TLSMemory($0) }
        if let credentials {
            guard fpt_supports_tls() != 0 else {
                close(socket.fd)
                credentials.deallocate()
                throw .tlsUnsupported
            }
            flags |= MHD_USE_TLS.rawValue
            options.append(
                MHD_OptionItem(
                    option: .HTTPS_MEM_CERT, value: 0, ptr_value: UnsafeMutableRawPointer(credentials.certificate)))
            options.append(
                MHD_OptionItem(option: .HTTPS_MEM_KEY, value: 0, ptr_value: UnsafeMutableRawPointer(credentials.key)))
        }
        options.append(MHD_OptionItem(option: .END, value: 0, ptr_value: nil))
        // One daemon per thread, all taking connections from the one listening socket (which
        // libmicrohttpd makes non-blocking), as libmicrohttpd's own thread pool does.
        var daemons: [DaemonHandle] = []
        var contexts: [Daemon<Application>] = []
        do throws(ServerError) {
            // Every loop and its detached streams first: a daemon hands a stream to any loop.
            var loops: [DaemonLoop] = []
            var detachedLoops: [DetachedStreams] = []
            for _ in 0..<max(1, configuration.threads) {
                let loop = try DaemonLoop()
                loops.append(loop)
                detachedLoops.append(
                    try DetachedStreams(
                        loop: loop, clock: configuration.clock, ended: { [unowned self] in detachedStreamEnded($0) }))
            }
            for (loop, detached) in zip(loops, detachedLoops) {
                let context = Daemon(
                    server: self, loop: loop, detached: detached, detachedLoops: detachedLoops,
                    logBox: LogBox(log: log, limiter: warnings, clock: configuration.clock))
                let logger = LoggerHandle(box: context.logBox)
                loggers.append(logger)
                let cls = Unmanaged.passUnretained(context).toOpaque()
                guard
                    let daemon = fpt_start_daemon(
                        flags, mhdAcceptPolicy, cls, mhdAccessHandler, cls,
                        mhdRequestCompleted, mhdConnectionNotify, mhdURILog, cls,
                        socket.fd, logger.pointer, &options)
                else {
                    throw credentials == nil
                        ? .daemonStartFailed(socket.authority) : .tlsCredentialsRejected(socket.authority)
                }
                daemons.append(DaemonHandle(pointer: daemon))
                try context.loop.start(
                    daemon: daemons[daemons.count - 1],
                    madeProgress: { context.deadlines.takeProgress() },
                    tick: { [self] now in
                        enforce(context.deadlines, at: now)
                        context.detached.closeStalled(at: now, limit: .seconds(Int(eventStreamStallSeconds)))
                    }, detached: context.detached, clock: configuration.clock)
                contexts.append(context)  // only a started loop is stopped below
            }
            try watcher.start()
        } catch {
            for (index, daemon) in daemons.enumerated() {
                _ = MHD_quiesce_daemon(daemon.pointer)  // so that stopping it leaves the shared socket open
                if index < contexts.count { contexts[index].loop.stop() }
                MHD_stop_daemon(daemon.pointer)
            }
            close(socket.fd)
            for logger in loggers { logger.deallocate() }
            credentials?.deallocate()
            throw error
        }
        running.withLock {
            $0 = Running(
                daemons: daemons, contexts: contexts, loggers: loggers, credentials: credentials,
                authority: socket.authority)
        }
        log.log(.info, "listening on \(credentials == nil ? "http" : "https")://\(socket.authority)")
        return socket.authority
    }

    /// Graceful shutdown's step 4 (`Service.shutdown(engine:)`): stops accepting connections (every
    /// daemon is quiesced and the listening socket closed); open connections are served on. Does
    /// nothing when the server is not running or already quiesced.
    public func quiesce() {
        guard let run = running.withLock({ $0 }) else { return }
        guard
            quiesced.withLock({ done in
                defer { done = true }
                return !done
            })
        else { return }
        var listenFD: Int32 = -1
        // Each daemon is quiesced by its own loop's thread (see DaemonLoop.quiesce).
        for context in run.contexts { listenFD = max(listenFD, context.loop.quiesce()) }
        if listenFD >= 0 { close(listenFD) }
    }

    /// Graceful shutdown's step 5: gives requests in flight (streams included) up to
    /// `configuration.shutdownGraceSeconds` less `Self.finalStepsSeconds` to finish, and logs a
    /// warning when some are left. The second kept back is for what follows: `stop()` answers
    /// what is left (up to `Self.answerLeftSeconds`), and the service closes its store (up to
    /// `Service.storeCloseSeconds`), so that the whole shutdown after the drain takes at most the
    /// grace period, whatever the store is doing.
    public func awaitIdle() {
        guard running.withLock({ $0 != nil }) else { return }
        let wait = max(0, configuration.shutdownGraceSeconds - Self.finalStepsSeconds)
        if !waitUntilIdle(seconds: wait) {
            // Detached streams are no longer libmicrohttpd's requests: counted beside them.
            let open = inFlight.load(ordering: .acquiring) + detachedStreamLoads.reduce(0, +)
            log.log(
                .warning,
                "\(open) requests still open \(wait) s after the service stopped accepting; answering them")
        }
    }

    /// Seconds of the grace period that `awaitIdle()` leaves to the steps after it.
    public static var finalStepsSeconds: Double { 1.0 }
    /// The most seconds `stop()` waits for the answers it gave and the streams ended to be sent.
    static var answerLeftSeconds: Double { 0.5 }

    /// Graceful shutdown's last engine step, after the application has ended every remaining
    /// stream (`Service.shutdown(engine:)`, which resumes their connections): answers every write
    /// still waiting for its store (`PendingResponse.abandon()`: `503 store_unavailable`, whatever
    /// the store is doing), waits up to `answerLeftSeconds` for the daemons to send those answers
    /// and free the streams, then stops the daemons. libmicrohttpd must not be stopped with a
    /// suspended connection (it aborts the process): after this, none is left but one whose
    /// stream or answer the daemons could not send in time, which is then resumed (not
    /// suspended) and closed. Returns when the daemons have stopped. Does nothing when the server
    /// is not running.
    public func stop() {
        quiesce()
        guard
            let run = running.withLock({ state in
                defer { state = nil }
                return state
            })
        else { return }
        let abandoned = parked.withLock { $0.close() }
        for pending in abandoned { pending.abandon() }
        if !abandoned.isEmpty {
            log.log(
                .warning,
                "\(abandoned.count) writes were still waiting for the token's store; answered 503 store_unavailable")
        }
        _ = waitUntilIdle(seconds: Self.answerLeftSeconds)
        watcher.stop()
        for context in run.contexts { context.loop.stop() }
        // Detached streams whose client did not take their last chunk within the grace period
        // (the loops have ended: nothing else touches them now).
        let cut = run.contexts.reduce(0) { $0 + $1.detached.closeAll() }
        if cut > 0 { log.log(.warning, "\(cut) event streams did not take their end in time; closed") }
        for daemon in run.daemons { MHD_stop_daemon(daemon.pointer) }
        cachedReads.clear()
        for logger in run.loggers { logger.deallocate() }
        run.credentials?.deallocate()
        log.log(.info, "stopped")
    }

    /// How many detached streams each daemon loop serves (adopted and not yet ended), in loop
    /// order; empty when the server is not running. The hand-over keeps them within one of each
    /// other while streams only open (`DetachedStreams`).
    var detachedStreamLoads: [Int] {
        running.withLock { $0?.contexts.map(\.detached.load) ?? [] }
    }

    private func waitUntilIdle(seconds: Double) -> Bool {
        waitUntil(seconds: seconds) { inFlight.load(ordering: .acquiring) == 0 && openStreams.withLock { $0 } == 0 }
    }

    /// Whether `condition` held within `seconds` of `configuration.clock`, looking every 10 ms (a
    /// timed wait on the clock for a signal nobody sends: a manual clock's test moves the time, and
    /// sees the wait begun, between two looks).
    private func waitUntil(seconds: Double, _ condition: () -> Bool) -> Bool {
        let clock = configuration.clock
        let deadline = clock.now + .milliseconds(Int(seconds * 1000))
        let never = DispatchSemaphore(value: 0)
        while !condition() {
            let left = deadline - clock.now
            if left <= .zero { return false }
            clock.wait(on: never, for: min(left, .milliseconds(10)))
        }
        return true
    }

    /// Raises the process's soft `RLIMIT_NOFILE` to its hard limit and returns the soft limit in
    /// force (`nil` when it cannot be read or is unlimited).
    private static func raiseFileLimit(log: ServerLog) -> UInt64? {
        var limit = rlimit()
        let resource = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)
        guard getrlimit(resource, &limit) == 0 else { return nil }
        if limit.rlim_cur < limit.rlim_max {
            var raised = limit
            raised.rlim_cur = limit.rlim_max
            if setrlimit(resource, &raised) == 0 {
                limit = raised
            } else {
                log.log(.warning, "could not raise the open-file limit: \(systemErrorText(errno))")
            }
        }
        return limit.rlim_cur == rlim_t.max ? nil : UInt64(limit.rlim_cur)  // RLIM_INFINITY
    }
}

/// A libmicrohttpd daemon pointer that may cross threads.
///
/// `@unchecked Sendable` is sound because the pointer is only passed to libmicrohttpd functions
/// that its manual allows from any thread (`MHD_quiesce_daemon`, `MHD_stop_daemon`), and only by
/// `stop()`, which takes it out of the server's lock so that it is used once, and to the
/// functions that drive the daemon (`MHD_get_fdset2`, `MHD_get_timeout`, `MHD_run`), which only its
/// `DaemonLoop`'s thread calls, and which `stop()` stops before `MHD_stop_daemon`.
struct DaemonHandle: @unchecked Sendable {
    let pointer: OpaquePointer
}

/// The PEM texts of `TLSCredentials` as C strings that libmicrohttpd may keep pointers to.
///
/// `@unchecked Sendable` is sound because the memory is written once before the daemons start,
/// only read by libmicrohttpd afterwards, and freed after every daemon has stopped.
struct TLSMemory: @unchecked Sendable {
    let certificate: UnsafeMutablePointer<CChar>
    let key: UnsafeMutablePointer<CChar>

    init(_ credentials: TLSCredentials) {
        certificate = strdup(credentials.certificatePEM)
        key = strdup(credentials.privateKeyPEM)
    }

    /// Frees both copies. The key is not overwritten first: its text stays in memory elsewhere for
    /// the process's life (the `TLSCredentials` it came from, a Swift `String` that cannot be
    /// wiped, and GnuTLS' parsed key inside each daemon until it stops), so wiping this one copy
    /// would only pretend the key had left memory. The key file's permissions protect it.
    func deallocate() {
        free(certificate)
        free(key)
    }
}

/// The heap-allocated logger libmicrohttpd calls (`MHD_OPTION_EXTERNAL_LOGGER`).
///
/// `@unchecked Sendable` is sound because the memory is written once before the daemon starts,
/// only read afterwards (by libmicrohttpd's thread), and freed after the daemon has stopped.
struct LoggerHandle: @unchecked Sendable {
    let pointer: UnsafeMutablePointer<fpt_logger>

    init(box: LogBox) {
        pointer = .allocate(capacity: 1)
        pointer.initialize(to: fpt_logger(callback: mhdLog, cls: Unmanaged.passRetained(box).toOpaque()))
    }

    func deallocate() {
        Unmanaged<LogBox>.fromOpaque(pointer.pointee.cls).release()
        pointer.deallocate()
    }
}

final class LogBox: Sendable {
    let log: ServerLog
    /// libmicrohttpd's warnings are caused by clients (a broken request line, a head over the
    /// pool): at most `warningsPerSecond` a second reach the log, then one line says how many were
    /// left out (attack finding: 2,000 broken requests wrote 2,000 lines in 0.3 s). One budget
    /// for all of a server's daemons.
    let limiter: Locked<LineBudget>
    /// How many "Application reported internal error" lines this box's daemon is about to log for
    /// connections it handed over (`MHD_NO` from the access handler is how a hand-over ends
    /// libmicrohttpd's part; `DetachedStream`). Such a line is logged by the same daemon, on its
    /// loop's thread, right after the handler returns; counting per daemon keeps another server's
    /// or daemon's hand-overs from hiding a genuine line of this one.
    private let expectedHandOverLines = Atomic<Int>(0)

    /// `ServerConfiguration.clock`: when a second of warnings begins.
    let clock: ServerClock

    init(log: ServerLog, limiter: Locked<LineBudget>, clock: ServerClock = .monotonic) {
        self.log = log
        self.limiter = limiter
        self.clock = clock
    }

    /// Counts one hand-over line the daemon is about to log.
    func expectHandOverLine() { expectedHandOverLines.add(1, ordering: .relaxed) }

    /// Takes one expected hand-over line, if any is expected.
    func takeExpectedHandOverLine() -> Bool {
        var current = expectedHandOverLines.load(ordering: .relaxed)
        while current > 0 {
            let (exchanged, original) = expectedHandOverLines.compareExchange(
                expected: current, desired: current - 1, ordering: .relaxed)
            if exchanged { return true }
            current = original
        }
        return false
    }

    /// The most libmicrohttpd warnings written in one second.
    static let warningsPerSecond = 10
}

/// How many of libmicrohttpd's warnings this second has written, and how many were left out.
///
/// Thread-safety: a value type; `LogBox` keeps it behind a lock.
struct LineBudget: Sendable {
    /// When the second the count is for began (`nil` before the first line).
    var second: ContinuousClock.Instant?
    /// Lines written in it.
    var written = 0
    /// Lines left out since the last one written.
    var leftOut = 0

    /// Whether a line may be written at `now`: `nil` when not (it is counted), else how many were
    /// left out before it. A second starts at the first line after the last one ended.
    mutating func admit(at now: ContinuousClock.Instant, perSecond: Int) -> Int? {
        if second.map({ now - $0 >= .seconds(1) }) ?? true {
            second = now
            written = 0
        }
        guard written < perSecond else {
            leftOut += 1
            return nil
        }
        written += 1
        defer { leftOut = 0 }
        return leftOut
    }
}

extension LogBox {
    /// Writes one of libmicrohttpd's own error messages into the service's log at warning level;
    /// the ones it writes for every event stream whose client has gone (the stream ends with
    /// `MHD_CONTENT_READER_END_WITH_ERROR`, which is how a departed subscriber is closed) and for a
    /// response whose client left before it was sent ("Failed to send the ...") at debug level, as
    /// they are routine, not faults (10,000 departing subscribers made 10,000 warnings). The line
    /// of each connection this box's daemon handed over is left out (`expectHandOverLine()`).
    ///
    /// Warnings are limited to `warningsPerSecond` a second of `clock` through `limiter`.
    /// Thread-safety: any thread (libmicrohttpd calls it on the daemon's loop thread).
    func logLibraryMessage(_ message: UnsafePointer<CChar>) {
        // The line libmicrohttpd logs for each connection this daemon hands over (`DetachedStream`).
        if strncmp(message, "Application reported internal error", 35) == 0, takeExpectedHandOverLine() { return }
        // A client that leaves mid-response: routine for event streams (and not the service's fault).
        let routine =
            strncmp(message, "Closing connection (application error generating response)", 58) == 0
            || strncmp(message, "Failed to send the", 18) == 0
        let level: ServerLogLevel = routine ? .debug : .warning
        guard level >= log.minimumLevel else { return }
        var text = String(cString: message)
        while let last = text.last, last.isWhitespace { text.removeLast() }
        if level >= .warning {
            let now = clock.now
            guard let leftOut = limiter.withLock({ $0.admit(at: now, perSecond: Self.warningsPerSecond) })
            else { return }
            if leftOut > 0 { text += " (\(leftOut) more libmicrohttpd warnings left out before this one)" }
        }
        log.log(level, "libmicrohttpd: \(text)")
    }
}

/// Descriptors kept back from the connection limit for the service's own files and sockets.
let reservedDescriptors = 64

import CHiredis
import ForgePushToken
import ForgePushTokenOwner
import GnuTLSClient
import ServerSupport

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Why a Redis connection or command failed.
///
/// Thread-safety: a value type, `Sendable`.
public enum RedisConnectionError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The server could not be reached, closed the connection, or spoke something that is not
    /// the Redis protocol. The string is hiredis' message (it never holds the password).
    case unreachable(String)
    /// No reply before the deadline. The connection must be dropped: with a command in flight,
    /// a later reply would answer the wrong request (and hiredis 0.14 cannot reuse a blocking
    /// context after a read timed out).
    case timedOut
    /// `AUTH` was refused, or the server demands a password that was not given (`NOAUTH`,
    /// `WRONGPASS`, `ERR invalid password`...).
    case authFailed(String)
    /// The server answered but refuses to serve: `READONLY` (a replica), `LOADING`,
    /// `MASTERDOWN`, `SELECT` out of range... The connection should be made again.
    case refused(String)
    /// The TLS handshake or the verification of the server's certificate failed, or the TLS
    /// session broke; the string says what failed (never key material).
    case tlsFailed(String)
    /// No sentinel of a sentinel URL answered; the string says why, per sentinel.
    case sentinelsUnreachable(String)
    /// The sentinels answered but name no master, or the node they name is not a master.
    case noMaster(String)
    /// A reply passed the bounds of `RedisReplyLimits` (a bulk string over 64 KiB, more than 64
    /// elements, nesting deeper than 4): refused before memory was spent on it, and the
    /// connection must be dropped (the reader cannot resume in the middle of a reply). The
    /// string names the limit (docs/replicas.md, "What a replica trusts").
    case replyTooLarge(String)

    /// One phrase for a log line.
    public var description: String {
        switch self {
        case .unreachable(let why): return "unreachable (\(why))"
        case .timedOut: return "no answer within the timeout"
        case .authFailed(let why): return "authentication failed (\(why))"
        case .refused(let why): return "refused (\(why))"
        case .tlsFailed(let why): return "TLS failed (\(why))"
        case .sentinelsUnreachable(let why): return "no sentinel answered (\(why))"
        case .noMaster(let why): return "no master (\(why))"
        case .replyTooLarge(let why): return "a reply over the limits (\(why))"
        }
    }

    /// Classifies an error reply that ends a connection's usefulness, or `nil` for an error that
    /// belongs to the one command (a script error, a wrong type...).
    ///
    /// Source: the Redis command reference for `AUTH`, `READONLY` replies of replicas,
    /// `LOADING` while a dataset loads, `MASTERDOWN` (`replica-serve-stale-data no`).
    public static func classify(errorReply message: String) -> RedisConnectionError? {
        let code = message.prefix(while: { $0 != " " })
        switch code {
        case "NOAUTH", "WRONGPASS", "NOPERM":
            return .authFailed(String(message.prefix(120)))
        case "READONLY", "LOADING", "MASTERDOWN", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MOVED", "ASK":
            return .refused(String(message.prefix(120)))
        case "ERR":
            let lowered = message.lowercased()
            if lowered.contains("invalid password") || lowered.contains("invalid username-password")
                || lowered.contains("without any password configured")
            {
                return .authFailed(String(message.prefix(120)))
            }
            return nil
        default:
            return nil
        }
    }
}

/// The Redis store's time in seconds, on the server's one clock (`ServerClock`): the store's
/// state machine (`RedisLinkStateMachine`) is a plain value that is handed the time, in seconds,
/// with every event. Counted from an origin 10^6 s before the first reading, so that a mark the
/// machine starts at 0 ("never") is long past, as it was with the system's uptime. Only compared
/// within this process (deadlines, intervals), never sent anywhere.
///
/// Read on `clock` (`RedisTokenStore.Configuration.clock`; the monotonic clock by default): a
/// test's manual clock, made at some real instant, gives seconds on the same base that move only
/// when the test says.
func monotonicSeconds(on clock: ServerClock = .monotonic) -> Double {
    clockOrigin.duration(to: clock.now).inSeconds
}

/// The origin of `monotonicSeconds()`, fixed on its first reading.
private let clockOrigin = ContinuousClock.now.advanced(by: .seconds(-1_000_000))

/// One connection to Redis, used from one thread at a time: plain TCP, a Unix socket, or TLS over
/// TCP, all through the same code (docs/replicas.md, "TLS to Redis").
///
/// The connection owns its socket (non-blocking) and, with TLS, a `TLSClientSession` over it;
/// hiredis reads and writes the Redis protocol: commands are formatted by
/// `redisFormatCommandArgv` (binary-safe) into an output buffer, several before one `flush`
/// (pipelining), and the bytes received are given to hiredis' reply reader (`redisReaderFeed`,
/// `redisReaderGetReply`). Every wait is a `poll(2)` up to a deadline: the connect, the TLS
/// handshake, each write and each read.
///
/// The host name lookup (`getaddrinfo`) before the connect is not bounded (use an IP address or a
/// local resolver when that matters). The process must ignore `SIGPIPE` (`forge-push-token-server`
/// does; `RedisTokenStore.start` sets it).
///
/// Thread-safety: not thread-safe; one thread owns a connection (the store's writer thread or
/// its subscription thread). It is not `Sendable`.
final class RedisConnection {
    private let socket: Int32
    private let tls: TLSClientSession?
    private let reader: UnsafeMutablePointer<redisReader>
    /// What the reader's own reply functions count for the reply being built, and which bound
    /// they refused (`RedisReplyLimits.Refusal`, read when hiredis reports the failure as "Out of
    /// memory"); the reader's private data points here.
    private let tally: UnsafeMutablePointer<RedisReplyLimits.Tally>
    private var output: [UInt8] = []
    private let ioTimeout: Double
    /// Whether any reply arrived (a connection closed before the first one may be a TLS port
    /// behind a `redis://` URL).
    private var answered = false
    /// With a sentinel URL, the sentinels' generation when the connection was made
    /// (`RedisConnector.hasMoved`).
    var generation: UInt64 = 0

    /// Connects (with TLS for a `rediss://` endpoint, verifying the server's certificate against
    /// `credentials`), authenticates and selects the database, each step bounded by `timeout`
    /// seconds.
    /// - Throws: `RedisConnectionError` (`.tlsFailed` when the handshake or the verification
    ///   fails); the socket is closed.
    /// - Parameter select: whether to send `SELECT` (a sentinel has no databases).
    init(endpoint: RedisEndpoint, timeout: Double, credentials: TLSClientCredentials? = nil, select: Bool = true)
        throws(RedisConnectionError)
    {
        ioTimeout = timeout
        let deadline = monotonicSeconds() + timeout
        let fd: Int32
        switch endpoint.address {
        case .tcp(let host, let port): fd = try RedisSocket.connectTCP(host: host, port: port, deadline: deadline)
        case .unix(let path): fd = try RedisSocket.connectUnix(path: path, deadline: deadline)
        }
        var session: TLSClientSession?
        if endpoint.tls, case .tcp(let host, _) = endpoint.address {
            do throws(RedisConnectionError) {
                guard let credentials else { throw .tlsFailed("no TLS credentials") }
                let made: TLSClientSession
                do throws(TLSError) {
                    made = try TLSClientSession(fd: fd, host: host, credentials: credentials)
                } catch {
                    throw .tlsFailed(error.description)
                }
                while true {
                    let wait: TLSClientSession.Wait?
                    do throws(TLSError) { wait = try made.handshake() } catch { throw .tlsFailed(error.description) }
                    guard let wait else { break }
                    guard try RedisSocket.wait(fd, for: Int16(wait == .writable ? POLLOUT : POLLIN), until: deadline)
                    else {
                        throw .tlsFailed("no TLS handshake with \(host) within \(timeout) s (is it a plain-text port?)")
                    }
                }
                session = made
            } catch {
                close(fd)
                throw error
            }
        }
        guard let made = redisReaderCreate() else {
            close(fd)
            throw .unreachable("out of memory")
        }
        // Allocated only once nothing before the last stored property can throw: an init that
        // throws earlier never runs `deinit`, which is what frees it.
        tally = UnsafeMutablePointer<RedisReplyLimits.Tally>.allocate(capacity: 1)
        tally.initialize(to: RedisReplyLimits.Tally())
        RedisReplyLimits.install(on: made, tally: tally)
        socket = fd
        tls = session
        reader = made
        do throws(RedisConnectionError) {
            if let password = endpoint.password {
                var auth: [[UInt8]] = [Array("AUTH".utf8)]
                if let user = endpoint.user { auth.append(Array(user.utf8)) }
                auth.append(password)
                let reply = try command(auth, timeout: timeout)
                if case .error(let message) = reply {
                    // Only the error code and Redis' own wording: never the password.
                    throw RedisConnectionError.classify(errorReply: message) ?? .authFailed(String(message.prefix(120)))
                }
            }
            if select {
                let reply = try command(["SELECT", String(endpoint.database)], timeout: timeout)
                if case .error(let message) = reply {
                    throw RedisConnectionError.classify(errorReply: message) ?? .refused(String(message.prefix(120)))
                }
            }
        } catch {
            // Every stored property is set, so `deinit` runs and closes the socket.
            throw error
        }
    }

    deinit {
        redisReaderFree(reader)
        tally.deallocate()
        close(socket)
    }

    /// Queues one command (arguments as bytes, binary-safe) in the output buffer; nothing is
    /// sent until `flush`.
    func append(_ arguments: [[UInt8]]) {
        var pointers: [UnsafePointer<CChar>?] = []
        var lengths: [Int] = []
        var storage: [UnsafeMutablePointer<CChar>] = []
        pointers.reserveCapacity(arguments.count)
        for argument in arguments {
            let buffer = UnsafeMutablePointer<CChar>.allocate(capacity: max(argument.count, 1))
            argument.withUnsafeBytes { raw in
                if let base = raw.baseAddress {
                    UnsafeMutableRawPointer(buffer).copyMemory(from: base, byteCount: argument.count)
                }
            }
            storage.append(buffer)
            pointers.append(UnsafePointer(buffer))
            lengths.append(argument.count)
        }
        defer { for pointer in storage { pointer.deallocate() } }
        var formatted: UnsafeMutablePointer<CChar>?
        let length = pointers.withUnsafeMutableBufferPointer { argv in
            lengths.withUnsafeBufferPointer { argvlen in
                redisFormatCommandArgv(&formatted, Int32(arguments.count), argv.baseAddress, argvlen.baseAddress)
            }
        }
        guard let formatted else { return }
        defer { redisFreeCommand(formatted) }
        if length > 0 {
            output.append(contentsOf: UnsafeRawBufferPointer(start: formatted, count: Int(length)))
        }
    }

    /// Queues one command given as strings (UTF-8).
    func append(_ arguments: [String]) {
        append(arguments.map { Array($0.utf8) })
    }

    /// Writes the output buffer to the socket, waiting at most the connection's timeout.
    /// - Throws: `.unreachable` when the write fails or does not finish in time, `.tlsFailed`
    ///   when the TLS session breaks.
    func flush() throws(RedisConnectionError) {
        let deadline = monotonicSeconds() + ioTimeout
        var sent = 0
        defer { output.removeFirst(sent) }
        while sent < output.count {
            let wrote: Int
            if let tls {
                let result = output.withUnsafeBytes { bytes in
                    Result { () throws(TLSError) in try tls.send(UnsafeRawBufferPointer(rebasing: bytes[sent...])) }
                }
                switch result {
                case .success(let count): wrote = count
                case .failure(let error): throw Self.failure(error)
                }
            } else {
                let result = output.withUnsafeBytes { bytes in
                    write(socket, bytes.baseAddress! + sent, bytes.count - sent)
                }
                if result < 0 {
                    guard errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR else {
                        throw .unreachable(systemErrorText(errno))
                    }
                    wrote = 0
                } else {
                    wrote = result
                }
            }
            sent += wrote
            if wrote == 0, !(try RedisSocket.wait(socket, for: Int16(POLLOUT), until: deadline)) {
                throw .unreachable("the write did not finish within \(ioTimeout) s")
            }
        }
    }

    /// The next reply, waiting until `deadline` (`monotonicSeconds(on: clock)`; the monotonic
    /// clock by default). On a manual clock each poll(2) lasts at most
    /// `ServerClock.manualLookInterval` of real time, and the deadline is the clock's.
    /// - Throws: `.timedOut` at the deadline, `.unreachable` when the connection breaks.
    func readReply(deadline: Double, on clock: ServerClock = .monotonic) throws(RedisConnectionError) -> RedisReply {
        while true {
            if let reply = try takeBufferedReply() { return reply }
            let remaining = deadline - monotonicSeconds(on: clock)
            guard remaining > 0 else { throw .timedOut }
            let milliseconds = min(remaining * 1000, 60_000).rounded(.up)
            try waitAndRead(
                milliseconds: clock.isMonotonic
                    ? Int32(milliseconds)
                    : min(Int32(milliseconds), clock.realTimeout(for: .seconds(1)).timeoutMilliseconds))
        }
    }

    /// A reply already received, or one that arrives within `milliseconds`; `nil` when none did.
    /// - Throws: `.unreachable` when the connection breaks.
    func pollReply(milliseconds: Int32) throws(RedisConnectionError) -> RedisReply? {
        if let reply = try takeBufferedReply() { return reply }
        try waitAndRead(milliseconds: milliseconds)
        return try takeBufferedReply()
    }

    /// Sends one command and waits up to `timeout` seconds for its reply.
    func command(_ arguments: [[UInt8]], timeout: Double) throws(RedisConnectionError) -> RedisReply {
        append(arguments)
        try flush()
        return try readReply(deadline: monotonicSeconds() + timeout)
    }

    /// Sends one command given as strings and waits up to `timeout` seconds for its reply.
    func command(_ arguments: [String], timeout: Double) throws(RedisConnectionError) -> RedisReply {
        try command(arguments.map { Array($0.utf8) }, timeout: timeout)
    }

    /// Waits up to `milliseconds` for bytes and gives what arrived to the reader.
    private func waitAndRead(milliseconds: Int32) throws(RedisConnectionError) {
        if !(tls?.hasBufferedBytes ?? false) {
            var descriptor = pollfd(fd: socket, events: Int16(POLLIN), revents: 0)
            let ready = poll(&descriptor, 1, milliseconds)
            if ready < 0 {
                if errno == EINTR { return }
                throw .unreachable("poll failed: errno \(errno)")
            }
            guard ready > 0 else { return }
        }
        var buffer = [UInt8](repeating: 0, count: 16 * 1024)
        let count: Int
        if let tls {
            let result = buffer.withUnsafeMutableBytes { bytes in
                Result { () throws(TLSError) in try tls.receive(into: bytes) }
            }
            let received: TLSClientSession.Received
            switch result {
            case .success(let value): received = value
            case .failure(let error): throw Self.failure(error)
            }
            switch received {
            case .bytes(let n): count = n
            case .closed: throw closed("Server closed the connection")
            case .wait: return
            }
        } else {
            let result = buffer.withUnsafeMutableBytes { read(socket, $0.baseAddress, $0.count) }
            if result < 0 {
                if errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR { return }
                throw closed(systemErrorText(errno))
            }
            if result == 0 { throw closed("Server closed the connection") }
            count = result
        }
        let fed = buffer.withUnsafeBytes { bytes in
            redisReaderFeed(reader, bytes.baseAddress?.assumingMemoryBound(to: CChar.self), count)
        }
        if fed != REDIS_OK { throw .unreachable(String(cString: fpt_redis_reader_errstr(reader))) }
    }

    /// A TLS session that broke after its handshake: its socket failing is `.unreachable` (Redis
    /// went away); anything else (an alert, such as a client certificate required under TLS 1.3)
    /// is `.tlsFailed`.
    private static func failure(_ error: TLSError) -> RedisConnectionError {
        error.isSocketError ? .unreachable(error.description) : .tlsFailed(error.description)
    }

    /// The error for a connection the server closed or reset (`why`); before its first answer
    /// on plain text, it says that the port may serve TLS.
    private func closed(_ why: String) -> RedisConnectionError {
        if answered || tls != nil { return .unreachable(why) }
        return .unreachable("\(why) before Redis answered; if this port serves TLS, use a rediss:// URL")
    }

    private func takeBufferedReply() throws(RedisConnectionError) -> RedisReply? {
        var raw: UnsafeMutableRawPointer?
        if redisReaderGetReply(reader, &raw) != REDIS_OK {
            if let refused = RedisReplyLimits.Refusal(rawValue: tally.pointee.refusal) {
                throw .replyTooLarge(refused.description)
            }
            throw .unreachable("not the Redis protocol: \(String(cString: fpt_redis_reader_errstr(reader)))")
        }
        guard let raw else {
            // No whole reply is buffered, so everything unread is one reply's unfinished part:
            // hiredis keeps a bulk string (or a line) until all of it arrived, so it is bounded
            // here, after every feed, before it grows.
            let unread = reader.pointee.len - reader.pointee.pos
            if unread > RedisReplyLimits.maximumUnreadBytes {
                throw .replyTooLarge(
                    "\(unread) bytes of one unfinished reply; a bulk string may hold at most "
                        + "\(RedisReplyLimits.maximumBulkBytes) bytes")
            }
            return nil
        }
        answered = true
        tally.pointee.nextReply()
        defer { freeReplyObject(raw) }
        return Self.decode(UnsafePointer(raw.assumingMemoryBound(to: redisReply.self)))
    }

    /// Converts hiredis' reply tree into a `RedisReply`.
    static func decode(_ reply: UnsafePointer<redisReply>) -> RedisReply {
        let value = reply.pointee
        switch value.type {
        case REDIS_REPLY_STRING:
            guard let str = value.str else { return .bulk([]) }
            return .bulk(Array(UnsafeRawBufferPointer(start: str, count: value.len)))
        case REDIS_REPLY_STATUS:
            guard let str = value.str else { return .status("") }
            return .status(String(decoding: UnsafeRawBufferPointer(start: str, count: value.len), as: UTF8.self))
        case REDIS_REPLY_ERROR:
            guard let str = value.str else { return .error("") }
            return .error(String(decoding: UnsafeRawBufferPointer(start: str, count: value.len), as: UTF8.self))
        case REDIS_REPLY_INTEGER:
            return .integer(Int64(value.integer))
        case REDIS_REPLY_ARRAY:
            var elements: [RedisReply] = []
            elements.reserveCapacity(value.elements)
            for index in 0..<value.elements {
                if let element = fpt_redis_element(reply, index) {
                    elements.append(decode(element))
                } else {
                    elements.append(.null)
                }
            }
            return .array(elements)
        default:
            return .null
        }
    }
}

import CHiredis

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

    /// One phrase for a log line.
    public var description: String {
        switch self {
        case .unreachable(let why): return "unreachable (\(why))"
        case .timedOut: return "no answer within the timeout"
        case .authFailed(let why): return "authentication failed (\(why))"
        case .refused(let why): return "refused (\(why))"
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

/// The current time on the monotonic clock, in seconds.
func monotonicSeconds() -> Double {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return Double(now.tv_sec) + Double(now.tv_nsec) / 1e9
}

/// One connection to Redis over hiredis 0.14's blocking API, used from one thread at a time.
///
/// Waits never rely on a socket timeout (hiredis 0.14 cannot reuse a context whose read timed
/// out): every read first waits for the socket with `poll(2)` up to a deadline, then calls
/// `redisBufferRead` (which then does not block) and takes complete replies with
/// `redisGetReplyFromReader`. Commands are sent with `redisAppendCommandArgv` (binary-safe) and
/// flushed with `redisBufferWrite`; several may be appended before one flush (pipelining).
///
/// `redisConnectWithTimeout` bounds the TCP connect only; the name lookup before it is not
/// bounded (use an IP address or a local resolver when that matters). hiredis writes with
/// `write(2)`, so the process must ignore `SIGPIPE` (`forge-push-token-server` does).
///
/// Thread-safety: not thread-safe; one thread owns a connection (the store's writer thread or
/// its subscription thread). It is not `Sendable`.
final class RedisConnection {
    private let context: UnsafeMutablePointer<redisContext>

    /// Connects, authenticates and selects the database, each step bounded by `timeout` seconds.
    /// - Throws: `RedisConnectionError` (the context is freed, here or by `deinit`).
    init(endpoint: RedisEndpoint, timeout: Double) throws(RedisConnectionError) {
        let whole = Int(timeout)
        var limit = timeval(tv_sec: whole, tv_usec: Int(((timeout - Double(whole)) * 1e6).rounded()))
        #if canImport(Darwin)
            limit.tv_usec = __darwin_suseconds_t(limit.tv_usec)
        #endif
        let made: UnsafeMutablePointer<redisContext>?
        switch endpoint.address {
        case .tcp(let host, let port):
            made = redisConnectWithTimeout(host, Int32(port), limit)
        case .unix(let path):
            made = redisConnectUnixWithTimeout(path, limit)
        }
        guard let made else { throw .unreachable("out of memory") }
        if made.pointee.err != 0 {
            let message = String(cString: fpt_redis_errstr(made))
            redisFree(made)
            throw .unreachable(message)
        }
        context = made
        // TCP keep-alive only on TCP: on a Unix socket setsockopt fails and hiredis would leave
        // that error on the context, failing every later command.
        if case .tcp = endpoint.address { _ = redisEnableKeepAlive(made) }
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
            let reply = try command(["SELECT", String(endpoint.database)], timeout: timeout)
            if case .error(let message) = reply {
                throw RedisConnectionError.classify(errorReply: message) ?? .refused(String(message.prefix(120)))
            }
        } catch {
            // Every stored property is set, so `deinit` runs and frees the context.
            throw error
        }
    }

    deinit {
        redisFree(context)
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
        _ = pointers.withUnsafeMutableBufferPointer { argv in
            lengths.withUnsafeBufferPointer { argvlen in
                redisAppendCommandArgv(context, Int32(arguments.count), argv.baseAddress, argvlen.baseAddress)
            }
        }
    }

    /// Queues one command given as strings (UTF-8).
    func append(_ arguments: [String]) {
        append(arguments.map { Array($0.utf8) })
    }

    /// Writes the output buffer to the socket.
    /// - Throws: `.unreachable` when the write fails.
    func flush() throws(RedisConnectionError) {
        var done: Int32 = 0
        while done == 0 {
            if redisBufferWrite(context, &done) != REDIS_OK {
                throw .unreachable(String(cString: fpt_redis_errstr(context)))
            }
        }
    }

    /// The next reply, waiting until `deadline` (monotonic seconds).
    /// - Throws: `.timedOut` at the deadline, `.unreachable` when the connection breaks.
    func readReply(deadline: Double) throws(RedisConnectionError) -> RedisReply {
        while true {
            if let reply = try takeBufferedReply() { return reply }
            let remaining = deadline - monotonicSeconds()
            guard remaining > 0 else { throw .timedOut }
            try waitAndRead(milliseconds: Int32(min(remaining * 1000, 60_000).rounded(.up)))
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

    private func waitAndRead(milliseconds: Int32) throws(RedisConnectionError) {
        var descriptor = pollfd(fd: fpt_redis_fd(context), events: Int16(POLLIN), revents: 0)
        let ready = poll(&descriptor, 1, milliseconds)
        if ready < 0 {
            if errno == EINTR { return }
            throw .unreachable("poll failed: errno \(errno)")
        }
        guard ready > 0 else { return }
        if redisBufferRead(context) != REDIS_OK {
            throw .unreachable(String(cString: fpt_redis_errstr(context)))
        }
    }

    private func takeBufferedReply() throws(RedisConnectionError) -> RedisReply? {
        var raw: UnsafeMutableRawPointer?
        if redisGetReplyFromReader(context, &raw) != REDIS_OK {
            throw .unreachable(String(cString: fpt_redis_errstr(context)))
        }
        guard let raw else { return nil }
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

import ForgePushToken
import ForgePushTokenOwner
import ServerSupport

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// The socket calls under `RedisConnection`: a non-blocking TCP or Unix-socket connect bounded by
/// a deadline, and `poll(2)` until a deadline. TCP sockets get `TCP_NODELAY` (commands are small
/// and answered one batch at a time) and keep-alive (15 s idle, as hiredis 0.14's
/// `redisEnableKeepAlive`), so that a peer gone without a word is noticed.
///
/// Thread-safety: stateless; safe from any thread.
enum RedisSocket {
    /// Connects to `host` (a name or an IP literal) on `port`, trying each address
    /// `getaddrinfo(3)` returns until `deadline` (monotonic seconds).
    /// - Returns: the connected, non-blocking socket.
    /// - Throws: `.unreachable` saying why the last address failed.
    static func connectTCP(host: String, port: Int, deadline: Double) throws(RedisConnectionError) -> Int32 {
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        #if canImport(Glibc)
            hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        #else
            hints.ai_socktype = SOCK_STREAM
        #endif
        var list: UnsafeMutablePointer<addrinfo>?
        let found = getaddrinfo(host, String(port), &hints, &list)
        guard found == 0, let list else {
            throw .unreachable("cannot resolve \(host): \(String(cString: gai_strerror(found)))")
        }
        defer { freeaddrinfo(list) }
        var why = "no address for \(host)"
        var next: UnsafeMutablePointer<addrinfo>? = list
        while let entry = next {
            next = entry.pointee.ai_next
            let fd = socket(entry.pointee.ai_family, entry.pointee.ai_socktype, entry.pointee.ai_protocol)
            if fd < 0 {
                why = systemErrorText(errno)
                continue
            }
            do throws(RedisConnectionError) {
                try connectBounded(fd, entry.pointee.ai_addr, entry.pointee.ai_addrlen, deadline: deadline)
                var on: Int32 = 1
                let size = socklen_t(MemoryLayout<Int32>.size)
                _ = setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &on, size)
                _ = setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, size)
                var idle: Int32 = 15
                _ = setsockopt(fd, Int32(IPPROTO_TCP), TCP_KEEPIDLE, &idle, size)
                var interval: Int32 = 5
                _ = setsockopt(fd, Int32(IPPROTO_TCP), TCP_KEEPINTVL, &interval, size)
                var count: Int32 = 3
                _ = setsockopt(fd, Int32(IPPROTO_TCP), TCP_KEEPCNT, &count, size)
                return fd
            } catch {
                close(fd)
                if case .unreachable(let text) = error { why = text }
                if monotonicSeconds() >= deadline { break }
            }
        }
        throw .unreachable(why)
    }

    /// Connects to the Unix domain socket at `path` before `deadline`.
    /// - Throws: `.unreachable` saying why.
    static func connectUnix(path: String, deadline: Double) throws(RedisConnectionError) -> Int32 {
        #if canImport(Glibc)
            let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        #else
            let fd = socket(AF_UNIX, SOCK_STREAM, 0)
        #endif
        guard fd >= 0 else { throw .unreachable(systemErrorText(errno)) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        let capacity = MemoryLayout.size(ofValue: address.sun_path)
        guard bytes.count < capacity else {
            close(fd)
            throw .unreachable("the socket path is too long")
        }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: bytes)
        }
        do throws(RedisConnectionError) {
            try withUnsafePointer(to: &address) { pointer throws(RedisConnectionError) in
                try pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { raw throws(RedisConnectionError) in
                    try connectBounded(fd, raw, socklen_t(MemoryLayout<sockaddr_un>.size), deadline: deadline)
                }
            }
        } catch {
            close(fd)
            throw error
        }
        return fd
    }

    /// Makes `fd` non-blocking and connects it, waiting until `deadline`.
    private static func connectBounded(
        _ fd: Int32, _ address: UnsafePointer<sockaddr>?, _ length: socklen_t, deadline: Double
    ) throws(RedisConnectionError) {
        let flags = fcntl(fd, F_GETFL, 0)
        _ = fcntl(fd, F_SETFL, flags | O_NONBLOCK)
        if connect(fd, address, length) == 0 { return }
        guard errno == EINPROGRESS || errno == EAGAIN || errno == EINTR else {
            throw .unreachable(systemErrorText(errno))
        }
        guard try wait(fd, for: Int16(POLLOUT), until: deadline) else {
            throw .unreachable("Connection timed out")
        }
        var failure: Int32 = 0
        var size = socklen_t(MemoryLayout<Int32>.size)
        guard getsockopt(fd, SOL_SOCKET, SO_ERROR, &failure, &size) == 0 else {
            throw .unreachable(systemErrorText(errno))
        }
        if failure != 0 { throw .unreachable(systemErrorText(failure)) }
    }

    /// Waits until `fd` is ready for `events` (`POLLIN`, `POLLOUT`) or `deadline` passes.
    /// - Returns: `true` when ready (or in error: the next call says which), `false` at the
    ///   deadline.
    /// - Throws: `.unreachable` when `poll` itself fails.
    static func wait(_ fd: Int32, for events: Int16, until deadline: Double) throws(RedisConnectionError) -> Bool {
        while true {
            let remaining = deadline - monotonicSeconds()
            guard remaining > 0 else { return false }
            var descriptor = pollfd(fd: fd, events: events, revents: 0)
            let ready = poll(&descriptor, 1, Int32(min(remaining * 1000, 60_000).rounded(.up)))
            if ready > 0 { return true }
            if ready < 0 && errno != EINTR { throw .unreachable("poll failed: \(systemErrorText(errno))") }
        }
    }
}

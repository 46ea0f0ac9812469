#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// A bound, listening TCP socket, made here rather than by libmicrohttpd so that a failure to
/// bind reports its exact cause (`EADDRINUSE` above all) and `--port 0` learns its real port.
struct ListeningSocket {
    let fd: Int32
    let port: UInt16
    let isIPv6: Bool
    /// `HOST:PORT` as a URL authority: IPv6 hosts in brackets.
    let authority: String

    /// Binds `host:port` and listens with the largest backlog the system allows.
    static func bind(host: String, port: UInt16) throws(ServerError) -> ListeningSocket {
        let literal = HostAddress.literal(host)
        var v4 = sockaddr_in()
        var v6 = sockaddr_in6()
        let isIPv6: Bool
        if inet_pton(AF_INET, literal, &v4.sin_addr) == 1 {
            isIPv6 = false
        } else if inet_pton(AF_INET6, literal, &v6.sin6_addr) == 1 {
            isIPv6 = true
        } else {
            throw .invalidHost(host)
        }
        let display = HostAddress.authority(literal, port: port)
        #if canImport(Darwin)
            let kind = SOCK_STREAM
        #else
            let kind = Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
        #endif
        let fd = socket(isIPv6 ? AF_INET6 : AF_INET, kind, 0)
        guard fd >= 0 else { throw .socket(call: "socket", address: display, errno: errno) }
        var on: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, socklen_t(MemoryLayout<Int32>.size))
        let bound: Int32
        if isIPv6 {
            v6.sin6_family = sa_family_t(AF_INET6)
            v6.sin6_port = port.bigEndian
            bound = withUnsafePointer(to: &v6) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    systemBind(fd, $0, socklen_t(MemoryLayout<sockaddr_in6>.size))
                }
            }
        } else {
            v4.sin_family = sa_family_t(AF_INET)
            v4.sin_port = port.bigEndian
            bound = withUnsafePointer(to: &v4) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    systemBind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                }
            }
        }
        if bound != 0 {
            let code = errno
            close(fd)
            if code == EADDRINUSE { throw .addressInUse(display) }
            throw .socket(call: "bind", address: display, errno: code)
        }
        guard listen(fd, SOMAXCONN) == 0 else {
            let code = errno
            close(fd)
            throw .socket(call: "listen", address: display, errno: code)
        }
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        _ = withUnsafeMutablePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        let actual: UInt16 = withUnsafePointer(to: &storage) { pointer in
            isIPv6
                ? pointer.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) {
                    UInt16(bigEndian: $0.pointee.sin6_port)
                }
                : pointer.withMemoryRebound(to: sockaddr_in.self, capacity: 1) {
                    UInt16(bigEndian: $0.pointee.sin_port)
                }
        }
        let authority = HostAddress.authority(literal, port: actual)
        return ListeningSocket(fd: fd, port: actual, isIPv6: isIPv6, authority: authority)
    }
}

/// `bind(2)`, named apart from `ListeningSocket.bind`.
private func systemBind(_ fd: Int32, _ address: UnsafePointer<sockaddr>, _ length: socklen_t) -> Int32 {
    #if canImport(Glibc)
        Glibc.bind(fd, address, length)
    #elseif canImport(Musl)
        Musl.bind(fd, address, length)
    #else
        Darwin.bind(fd, address, length)
    #endif
}

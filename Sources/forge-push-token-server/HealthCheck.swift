import MicroHTTPDServer

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// `--health-check`: asks a running service's `GET /healthz` (`--health-check=live`: `/livez`,
/// `--health-check=ready`: `/readyz`; docs/operations.md, "Probes") over a plain socket and
/// reports whether it answered 200, so a container `HEALTHCHECK` needs no curl in the image.
///
/// The address is the configured one, with a wildcard host (`0.0.0.0`, `::`) replaced by the
/// loopback address of its family. Connect, send and receive are each bounded by `timeout`
/// seconds.
///
/// With HTTPS (`--tls-cert`) the check is the TCP connection alone: a TLS client would take a TLS
/// library into the executable, and libmicrohttpd accepts only on a running daemon.
enum HealthCheck {
    /// The route a health check asks.
    enum Probe: String, Equatable {
        /// `/healthz` (`--health-check`).
        case health = "/healthz"
        /// `/livez` (`--health-check=live`).
        case live = "/livez"
        /// `/readyz` (`--health-check=ready`).
        case ready = "/readyz"

        /// The probe of `--health-check=VALUE`: `live` or `ready`; `nil` for anything else.
        init?(flagValue: String) {
            switch flagValue {
            case "live": self = .live
            case "ready": self = .ready
            default: return nil
            }
        }
    }

    /// `true` when `GET` of `probe` answered with status 200 (with HTTPS: when the port accepted).
    static func run(_ configuration: ServerConfiguration, probe: Probe = .health, timeout: Int = 2) -> Bool {
        let host = HostAddress.reachable(configuration.host)
        var hints = addrinfo()
        hints.ai_flags = AI_NUMERICHOST
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var found: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(host, String(configuration.port), &hints, &found) == 0, let address = found else {
            return false
        }
        defer { freeaddrinfo(found) }
        let fd = socket(address.pointee.ai_family, address.pointee.ai_socktype, 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var limit = timeval(tv_sec: timeout, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
        guard connect(fd, address.pointee.ai_addr, address.pointee.ai_addrlen) == 0 else { return false }
        if configuration.tls != nil { return true }
        let authority = HostAddress.authority(host, port: configuration.port)
        let request = Array("GET \(probe.rawValue) HTTP/1.1\r\nHost: \(authority)\r\nConnection: close\r\n\r\n".utf8)
        guard send(fd, request, request.count, Int32(MSG_NOSIGNAL)) == request.count else { return false }
        var head: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 256)
        while head.count < 12 {
            let count = recv(fd, &buffer, buffer.count, 0)
            guard count > 0 else { return false }
            head += buffer.prefix(count)
        }
        // "HTTP/1.1 200 ..." : the status code is bytes 9..<12.
        return head.starts(with: Array("HTTP/1.".utf8)) && Array(head[9..<12]) == Array("200".utf8)
    }
}

import GnuTLSClient
import MicroHTTPDServer

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// `--health-check`: asks a running service's `GET /healthz` (`--health-check=live`: `/livez`,
/// `--health-check=ready`: `/readyz`; docs/operations.md, "Probes") and reports whether it
/// answered 200, so a container `HEALTHCHECK` needs no curl in the image.
///
/// The address is the configured one, with a wildcard host (`0.0.0.0`, `::`) replaced by the
/// loopback address of its family. Connect, each send and each receive (with HTTPS: each step of
/// the handshake too) are bounded by `timeout` seconds.
///
/// With HTTPS (`--tls-cert`) the request goes over TLS (GnuTLSClient's `TLSClientSession`), and
/// the server must present the first certificate of the configured certificate file, byte for
/// byte (the loopback address is not one the certificate names, so names are not checked).
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

    /// `true` when `GET` of `probe` answered with status 200 (over TLS with `configuration.tls`).
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
        let authority = HostAddress.authority(host, port: configuration.port)
        let request = Array("GET \(probe.rawValue) HTTP/1.1\r\nHost: \(authority)\r\nConnection: close\r\n\r\n".utf8)
        var head: [UInt8] = []
        if let tls = configuration.tls {
            guard
                let answer = exchangeOverTLS(
                    fd, request, certificatePEM: Array(tls.certificatePEM.utf8), timeout: timeout)
            else { return false }
            head = answer
        } else {
            guard send(fd, request, request.count, Int32(MSG_NOSIGNAL)) == request.count else { return false }
            var buffer = [UInt8](repeating: 0, count: 256)
            while head.count < 12 {
                let count = recv(fd, &buffer, buffer.count, 0)
                guard count > 0 else { return false }
                head += buffer.prefix(count)
            }
        }
        // "HTTP/1.1 200 ..." : the status code is bytes 9..<12.
        return head.count >= 12 && head.starts(with: Array("HTTP/1.".utf8)) && Array(head[9..<12]) == Array("200".utf8)
    }

    /// Sends `request` over TLS on connected socket `fd` (made non-blocking here) and returns the
    /// first 12 or more bytes of the answer, or `nil` when the handshake, the certificate check,
    /// a send or a receive failed or waited more than `timeout` seconds.
    private static func exchangeOverTLS(_ fd: Int32, _ request: [UInt8], certificatePEM: [UInt8], timeout: Int)
        -> [UInt8]?
    {
        guard fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) == 0 else { return nil }
        /// Waits until `fd` is ready for `wait`; false after `timeout` seconds or an error.
        func ready(_ wait: TLSClientSession.Wait) -> Bool {
            var entry = pollfd(fd: fd, events: Int16(wait == .readable ? POLLIN : POLLOUT), revents: 0)
            return poll(&entry, 1, Int32(timeout * 1000)) == 1
        }
        do {
            let session = try TLSClientSession(fd: fd, presenting: certificatePEM)
            while let wait = try session.handshake() {
                guard ready(wait) else { return nil }
            }
            var sent = 0
            while sent < request.count {
                let count = try request[sent...].withUnsafeBytes { bytes throws(TLSError) in try session.send(bytes) }
                if count == 0 {
                    guard ready(.writable) else { return nil }
                }
                sent += count
            }
            var head: [UInt8] = []
            var buffer = [UInt8](repeating: 0, count: 256)
            while head.count < 12 {
                let received = try buffer.withUnsafeMutableBytes { bytes throws(TLSError) in
                    try session.receive(into: bytes)
                }
                switch received {
                case .bytes(let count): head += buffer.prefix(count)
                case .closed: return nil
                case .wait(let wait):
                    guard ready(wait) else { return nil }
                }
            }
            return head
        } catch {
            return nil
        }
    }
}

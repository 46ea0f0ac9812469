import CMicroHTTPD
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// The numeric address and port of `connection`'s peer, as the access log's `remote` field writes
/// it: `127.0.0.1:51234`, or `[::1]:51234` for IPv6 (the form of RFC 3986's authority). Formatted
/// by `getnameinfo(3)` with `NI_NUMERICHOST | NI_NUMERICSERV` (no name lookup). `nil` when
/// libmicrohttpd does not know the address or it is neither IPv4 nor IPv6.
///
/// Thread-safety: reads only the connection's own information; call it on the connection's
/// polling thread (libmicrohttpd's callbacks run there).
func peerAddress(of connection: OpaquePointer?) -> String? {
    guard let connection, let address = fpt_connection_address(connection) else { return nil }
    let family = Int32(address.pointee.sa_family)
    let length: socklen_t
    switch family {
    case AF_INET: length = socklen_t(MemoryLayout<sockaddr_in>.size)
    case AF_INET6: length = socklen_t(MemoryLayout<sockaddr_in6>.size)
    default: return nil
    }
    var host = [CChar](repeating: 0, count: Int(NI_MAXHOST))
    var port = [CChar](repeating: 0, count: Int(NI_MAXSERV))
    guard getnameinfo(address, length, &host, socklen_t(host.count), &port, socklen_t(port.count),
                      NI_NUMERICHOST | NI_NUMERICSERV) == 0 else { return nil }
    let hostText = host.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
    let portText = port.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
    return family == AF_INET6 ? "[\(hostText)]:\(portText)" : "\(hostText):\(portText)"
}

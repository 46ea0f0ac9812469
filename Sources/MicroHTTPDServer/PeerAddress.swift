import CMicroHTTPD

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// The numeric address and port of `connection`'s peer, as the access log's `remote` field writes
/// it: `127.0.0.1:51234`, or `[::1]:51234` for IPv6 (the form of RFC 3986's authority). The
/// address is formatted by `inet_ntop(3)`. `nil` when libmicrohttpd does not know the address or
/// it is neither IPv4 nor IPv6.
///
/// Thread-safety: reads only the connection's own information; call it on the connection's
/// polling thread (libmicrohttpd's callbacks run there).
func peerAddress(of connection: OpaquePointer?) -> String? {
    guard let connection, let address = fpt_connection_address(connection) else { return nil }
    var text = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
    switch Int32(address.pointee.sa_family) {
    case AF_INET:
        return address.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { ipv4 in
            var bytes = ipv4.pointee.sin_addr
            guard inet_ntop(AF_INET, &bytes, &text, socklen_t(text.count)) != nil else { return nil }
            return text.withUnsafeBufferPointer { String(cString: $0.baseAddress!) } + ":"
                + String(UInt16(bigEndian: ipv4.pointee.sin_port))
        }
    case AF_INET6:
        return address.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { ipv6 in
            var bytes = ipv6.pointee.sin6_addr
            guard inet_ntop(AF_INET6, &bytes, &text, socklen_t(text.count)) != nil else { return nil }
            return "[" + text.withUnsafeBufferPointer { String(cString: $0.baseAddress!) } + "]:"
                + String(UInt16(bigEndian: ipv6.pointee.sin6_port))
        }
    default:
        return nil
    }
}

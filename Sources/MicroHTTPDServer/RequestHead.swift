import CMicroHTTPD
import ForgePushToken
import ForgePushTokenHTTP

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

// What the responder sees of a request's head, read from libmicrohttpd: the method, the path, the
// header fields it reads and the `access_token` query parameter.

/// The header fields the responder reads, in the order it may need them.
private let headFields = [
    "Content-Type", "Authorization", "Origin", "Access-Control-Request-Method", "If-None-Match",
    "Last-Event-ID",
]

/// The head of a request as the responder sees it: `method`, `path` (libmicrohttpd has split off
/// the query), the header fields the responder reads, and as the query the `access_token`
/// parameter alone (re-encoded from libmicrohttpd's decoded value), as no other one matters.
func requestHead(_ connection: OpaquePointer, method: String, path: String) -> HTTPRequest {
    var headers = HTTPHeaders()
    for name in headFields {
        if let value = header(connection, name) { headers.add(name, value) }
    }
    var query: String?
    if let token = MHD_lookup_connection_value(connection, .GET_ARGUMENT_KIND, "access_token") {
        query = "access_token=" + percentEncoded(UnsafeRawBufferPointer(start: token, count: strlen(token)))
    }
    // libmicrohttpd has decoded the path: a "?" in it came from %3F and is part of the path.
    return HTTPRequest(method: method, path: path, query: query, headers: headers)
}

/// `bytes` with every byte but the unreserved ones of RFC 3986 §2.3 written as `%xx` (lowercase
/// hex digits, which RFC 3986 §2.1 makes equivalent to uppercase).
func percentEncoded(_ bytes: UnsafeRawBufferPointer) -> String {
    let digits = DeviceTokenHex.digits
    var encoded: [UInt8] = []
    encoded.reserveCapacity(bytes.count)
    for byte in bytes {
        switch byte {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"),
            UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"):
            encoded.append(byte)
        default:
            encoded += [UInt8(ascii: "%"), digits[Int(byte >> 4)], digits[Int(byte & 0xF)]]
        }
    }
    return String(decoding: encoded, as: UTF8.self)
}

/// The value of request header `name`, or `nil`.
func header(_ connection: OpaquePointer, _ name: String) -> String? {
    MHD_lookup_connection_value(connection, .HEADER_KIND, name).map { String(cString: $0) }
}

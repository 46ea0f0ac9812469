import CMicroHTTPD
import ForgePushToken
import HTTPServing

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

// What the application sees of a request's head, read from libmicrohttpd: the method, the path,
// the header fields and query parameters it reads (`HTTPApplicationTraits.headerFieldsRead`,
// `queryParametersRead`).

/// The head of a request as the application sees it: `method`, `path` (libmicrohttpd has split off
/// the query), the header fields named in `fields` that the request has, and as the query the
/// parameters named in `parameters` alone (re-encoded from libmicrohttpd's decoded values), their
/// values as `scan` kept them (`HeadFieldCapture`: `fields` and `parameters` are the ones its
/// slots were made for).
func requestHead(
    _ connection: OpaquePointer, method: String, path: String, fields: [String], parameters: [String],
    scan: FramingScan
) -> HTTPRequest {
    var headers = HTTPHeaders()
    headers.reserveCapacity(fields.count)
    for (name, slot) in zip(fields, scan.capture.headerSlots) {
        if let value = scan.fields.string(slot, name: name, on: connection) { headers.add(name, value) }
    }
    var query: String?
    for (name, slot) in zip(parameters, scan.capture.parameterSlots) {
        guard let value = scan.fields.value(slot, name: name, kind: .GET_ARGUMENT_KIND, on: connection)
        else { continue }
        let pair = name + "=" + percentEncoded(UnsafeRawBufferPointer(start: value, count: strlen(value)))
        query = query.map { $0 + "&" + pair } ?? pair
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

import TokenService
import HTTPServing

/// One request cut from the fuzzer's input, before it becomes an `HTTPRequest`.
struct RawRequest {
    var method: String
    var target: String
    var headers: HTTPHeaders
    var body: [UInt8]
}

/// The lenient reader that turns the fuzzer's bytes into requests (see fuzz/README.md, "Input
/// format"). It is the harness's own and deliberately forgiving: every input gives some requests,
/// and nothing here can fail. It stands in for libmicrohttpd only so far as to hand the responder
/// the same kinds of values (method, target, header fields, body bytes); it is not a conforming
/// HTTP/1.1 parser and is not under test.
///
/// The input is one or more HTTP/1.1 requests as text, one after another (pipelined):
///
///     METHOD SP TARGET [SP anything] LF        request line (CR before LF optional)
///     Name: value LF                           header fields, until an empty line
///     LF                                       end of the head
///     body                                     Content-Length bytes, else the rest of the input
///
/// - Empty lines (CR or LF bytes) before a request line are skipped (RFC 9112 §2.2).
/// - The method is the request line up to its first space, the target the next space-free run;
///   anything after it (the HTTP version) is ignored. A line without a space is a method alone
///   with an empty target.
/// - A header line is split at its first `:`; the value is trimmed of spaces and tabs. A line
///   without `:` is ignored; a line starting with a space or tab continues the previous value
///   (obsolete line folding). At most `maxHeaderFields` fields are kept.
/// - The body: with a `Content-Length` of decimal digits, that many bytes (or as many as remain),
///   and the next request follows; otherwise every remaining byte, and no request follows. No
///   transfer coding is decoded: a chunked body reaches the responder as it stands.
/// - Text becomes `String` as libmicrohttpd's C strings do through `String(cString:)`: invalid
///   UTF-8 is repaired with U+FFFD. The body stays raw bytes.
/// - At most `maxRequests` requests are read; the rest of the input is ignored.
enum RequestText {
    static let maxRequests = 8
    static let maxHeaderFields = 32

    static func parse(_ input: [UInt8]) -> [RawRequest] {
        var rest = input[...]
        var requests: [RawRequest] = []
        while requests.count < maxRequests {
            while let first = rest.first, first == cr || first == lf { rest = rest.dropFirst() }
            if rest.isEmpty { break }
            let requestLine = takeLine(&rest)
            let (method, target) = splitRequestLine(requestLine)
            var headers: [(name: String, value: String)] = []
            var length: Int?
            while !rest.isEmpty {
                let line = takeLine(&rest)
                if line.isEmpty { break }
                if line.first == space || line.first == tab {
                    if let last = headers.popLast() {
                        headers.append((last.name, last.value + " " + text(trimmed(line))))
                    }
                    continue
                }
                guard let colon = line.firstIndex(of: UInt8(ascii: ":")) else { continue }
                let name = text(trimmed(line[..<colon]))
                let value = text(trimmed(line[(colon + 1)...]))
                if headers.count < maxHeaderFields { headers.append((name, value)) }
                if length == nil, name.lowercased() == "content-length" { length = contentLength(value) }
            }
            let body: [UInt8]
            if let length {
                body = Array(rest.prefix(length))
                rest = rest.dropFirst(length)
            } else {
                body = Array(rest)
                rest = rest[rest.endIndex...]
            }
            requests.append(RawRequest(method: method, target: target, headers: HTTPHeaders(headers), body: body))
        }
        return requests
    }

    private static let cr = UInt8(ascii: "\r"), lf = UInt8(ascii: "\n")
    private static let space = UInt8(ascii: " "), tab = UInt8(ascii: "\t")

    /// The bytes up to the next LF (without it and without a CR before it); `rest` moves past the LF.
    private static func takeLine(_ rest: inout ArraySlice<UInt8>) -> ArraySlice<UInt8> {
        var line: ArraySlice<UInt8>
        if let end = rest.firstIndex(of: lf) {
            line = rest[..<end]
            rest = rest[(end + 1)...]
        } else {
            line = rest
            rest = rest[rest.endIndex...]
        }
        if line.last == cr { line = line.dropLast() }
        return line
    }

    private static func splitRequestLine(_ line: ArraySlice<UInt8>) -> (String, String) {
        guard let firstSpace = line.firstIndex(of: space) else { return (text(line), "") }
        let afterMethod = line[(firstSpace + 1)...]
        let target = afterMethod.prefix { $0 != space }
        return (text(line[..<firstSpace]), text(target))
    }

    private static func trimmed(_ bytes: ArraySlice<UInt8>) -> ArraySlice<UInt8> {
        var bytes = bytes
        while let first = bytes.first, first == space || first == tab { bytes = bytes.dropFirst() }
        while let last = bytes.last, last == space || last == tab { bytes = bytes.dropLast() }
        return bytes
    }

    private static func contentLength(_ value: String) -> Int? {
        guard !value.isEmpty, value.utf8.count <= 9, value.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) else { return nil }
        return Int(value)
    }

    private static func text(_ bytes: ArraySlice<UInt8>) -> String {
        String(decoding: bytes, as: UTF8.self)
    }
}

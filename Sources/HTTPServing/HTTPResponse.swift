import ServerSupport

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// One complete HTTP response: status, header fields and body bytes.
///
/// The engine adds `Content-Length` (or chunked framing), `Date` and `Connection` itself; for a
/// `HEAD` request it sends the same header fields without the body (RFC 9110 §9.3.2).
/// A value type; `Sendable`.
public struct HTTPResponse: Sendable {
    /// The status code, for example `200` (RFC 9110 §15).
    public var status: Int
    /// Header fields other than the framing ones the engine adds.
    public var headers: HTTPHeaders
    /// The body bytes.
    public var body: [UInt8]

    /// Creates a response.
    public init(status: Int, headers: HTTPHeaders = HTTPHeaders(), body: [UInt8] = []) {
        self.status = status
        self.headers = headers
        self.body = body
    }

    /// `Content-Type` of every JSON body this service sends.
    public static let jsonContentType = "application/json; charset=utf-8"

    /// A response whose body is already-encoded JSON bytes.
    public static func json(_ status: Int, _ body: [UInt8], headers: HTTPHeaders = HTTPHeaders()) -> HTTPResponse {
        // Shared, not built: every `POST /register` answers through here, and a literal allocated
        // two arrays each time.
        guard !headers.fields.isEmpty else { return HTTPResponse(status: status, headers: jsonHeaders, body: body) }
        var all = jsonHeaders
        all.reserveCapacity(1 + headers.fields.count)
        for field in headers { all.add(field.name, field.value) }
        return HTTPResponse(status: status, headers: all, body: body)
    }

    /// `Content-Type: application/json; charset=utf-8` alone.
    private static let jsonHeaders: HTTPHeaders = ["Content-Type": jsonContentType]

    /// A response whose body is `value` encoded by Foundation's `JSONEncoder`.
    public static func json(_ status: Int, encoding value: some Encodable, headers: HTTPHeaders = HTTPHeaders())
        -> HTTPResponse
    {
        json(status, JSONBody.encode(value), headers: headers)
    }

    /// The whole message as HTTP/1.1 bytes (RFC 9112 §4, §6), for an answer the engine writes to
    /// the socket itself, bypassing libmicrohttpd (a `408` for a request it is still reading): the
    /// status line with `reason`, `Date: date` (an IMF-fixdate, RFC 9110 §5.6.7), `Connection:
    /// close`, the fields completed as every answer's are (`ResponseHeaders.completing`: the CORS
    /// fields for `origin` under `crossOrigin`, the defaults), `Content-Length`, then the body.
    public func closingMessage(
        reason: String, date: String, crossOrigin: CrossOriginPolicy = CrossOriginPolicy(), origin: String? = nil
    ) -> [UInt8] {
        var head = "HTTP/1.1 \(status) \(reason)\r\nDate: \(date)\r\nConnection: close\r\n"
        for field in ResponseHeaders.completing(headers, crossOrigin: crossOrigin, origin: origin) {
            head += "\(field.name): \(field.value)\r\n"
        }
        head += "Content-Length: \(body.count)\r\n\r\n"
        return Array(head.utf8) + body
    }

    /// An error response with the body `{"error":"<code>","message":"<text>"}` (http-api.md,
    /// "Routes").
    public static func error(_ status: Int, _ error: ServiceError, headers: HTTPHeaders = HTTPHeaders()) -> HTTPResponse
    {
        json(status, encoding: error, headers: headers)
    }
}

/// The body of every error response this service produces: a stable machine-readable `error`
/// code (snake_case ASCII) and a human-readable `message`.
public struct ServiceError: Error, Sendable, Equatable, Encodable {
    /// The code, for example `"invalid_token"`.
    public var error: String
    /// What went wrong and, where useful, what to send instead.
    public var message: String

    /// Creates an error body.
    public init(_ code: String, _ message: String) {
        self.error = code
        self.message = message
    }
}

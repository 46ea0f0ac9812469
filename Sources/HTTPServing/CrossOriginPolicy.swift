import ServerSupport

/// Cross-origin resource sharing for browser clients on other origins (WHATWG Fetch standard,
/// "CORS protocol"): which origins may read the service's responses, and the answer to a
/// preflight `OPTIONS` request.
///
/// A response to a request whose `Origin` is allowed carries `Access-Control-Allow-Origin` (the
/// origin itself, or `*` when every origin is allowed) and `Vary: Origin`. No credentials mode
/// (`Access-Control-Allow-Credentials`): the service's bearer token travels in `Authorization`,
/// which needs none.
///
/// A value type; `Sendable`.
public struct CrossOriginPolicy: Sendable, Equatable {
    /// The allowed origins (`scheme://host[:port]`), in ASCII lower case as the WHATWG URL
    /// standard serializes an origin's scheme and host (and as browsers send `Origin`), or `["*"]`
    /// for every origin; empty when cross-origin reads are off (the default).
    public let origins: [String]

    /// Seconds a browser may cache a preflight answer (`Access-Control-Max-Age`).
    public static let maxAgeSeconds = 600
    /// Request header fields a cross-origin request may send (`Access-Control-Allow-Headers`).
    public static let allowedHeaders = "Authorization, Content-Type, Last-Event-ID, Cache-Control, If-None-Match"

    /// Response header fields a cross-origin page may read beyond the CORS-safelisted ones
    /// (`Access-Control-Expose-Headers`): `ETag`, so that it can send `If-None-Match`.
    public static let exposedHeaders = "Retry-After, WWW-Authenticate, ETag"

    /// Cross-origin reads off.
    public init() { origins = [] }

    /// Allows `origins`: each `*` or a serialized origin (`http://` or `https://`, a host, an
    /// optional port; no path, query or trailing slash), matched ASCII case-insensitively.
    /// - Throws: `ServiceError` (`invalid_origin`) naming the first malformed entry.
    public init(origins: [String]) throws(ServiceError) {
        for origin in origins where origin != "*" && !Self.isSerializedOrigin(origin) {
            throw ServiceError(
                "invalid_origin",
                "\(origin) is not an origin: write scheme://host[:port], for example https://app.example.com, or *")
        }
        self.origins = origins.map { $0.lowercased() }
    }

    /// Whether any origin is allowed at all.
    public var isEnabled: Bool { !origins.isEmpty }

    /// The `Access-Control-Allow-Origin` value for a request from `origin`, or `nil` when that
    /// origin is not allowed (or the request has no `Origin`). The value is the configured origin
    /// (in its serialized, lower-case form), never the request's own spelling: what the service
    /// sends back is what the operator allowed, not text a client chose.
    public func allowOriginValue(for origin: String?) -> String? {
        guard let origin, isEnabled else { return nil }
        if origins.contains("*") { return "*" }
        return origins.first { $0.caseInsensitiveEquals(origin) }
    }

    /// `headers` with the CORS header fields added for a request from `origin`: `Vary: Origin`
    /// whenever cross-origin reads are on, and `Access-Control-Allow-Origin` and
    /// `Access-Control-Expose-Headers` when `origin` is allowed; unchanged when cross-origin reads
    /// are off, and when `headers` has `Access-Control-Allow-Origin` already (a preflight answer).
    /// `ResponseHeaders.completing(_:crossOrigin:origin:)` calls it for every answer.
    public func decorating(_ headers: HTTPHeaders, origin: String?) -> HTTPHeaders {
        guard isEnabled, headers["Access-Control-Allow-Origin"] == nil else { return headers }
        var decorated = headers
        // With CORS on, every answer depends on the request's Origin (the Fetch standard, "CORS
        // protocol and HTTP caches"): a cache must not serve one origin's answer to another, nor
        // the answer to a request without Origin to one with it.
        if decorated["Vary"] == nil { decorated.add("Vary", "Origin") }
        guard let allowed = allowOriginValue(for: origin) else { return decorated }
        decorated.add("Access-Control-Allow-Origin", allowed)
        decorated.add("Access-Control-Expose-Headers", Self.exposedHeaders)
        return decorated
    }

    /// The answer to `OPTIONS` on a path that accepts `allowedMethods` (RFC 9110 §9.3.7): 204
    /// with `Allow`. A CORS preflight
    /// (it has `Origin` and `Access-Control-Request-Method`) from an allowed origin also gets
    /// `Access-Control-Allow-Origin`, `-Methods`, `-Headers` and `-Max-Age`; from another origin,
    /// 403 `origin_not_allowed`, which says how to allow it.
    public func options(allowing allowedMethods: [String], request: HTTPRequest) -> HTTPResponse {
        let allow = allowedMethods.joined(separator: ", ")
        let origin = request.headers["Origin"]
        guard let origin, request.headers["Access-Control-Request-Method"] != nil else {
            return HTTPResponse(status: 204, headers: ["Allow": allow])
        }
        guard let allowed = allowOriginValue(for: origin) else {
            return .error(
                403,
                ServiceError(
                    "origin_not_allowed",
                    "cross-origin requests from \(origin) are not allowed; start the service with --cors-origin \(origin)"
                ),
                headers: ["Vary": "Origin"])
        }
        return HTTPResponse(
            status: 204,
            headers: [
                "Allow": allow,
                "Access-Control-Allow-Origin": allowed,
                "Access-Control-Allow-Methods": allow,
                "Access-Control-Allow-Headers": Self.allowedHeaders,
                "Access-Control-Max-Age": String(Self.maxAgeSeconds),
                "Vary": "Origin",
            ])
    }

    /// Whether `text` is `http://` or `https://`, then a host of letters, digits, `-`, `.` (or an
    /// IPv6 literal in brackets), then an optional `:port` of 1 to 5 digits, and nothing else.
    static func isSerializedOrigin(_ text: String) -> Bool {
        let lower = String(decoding: text.utf8.map(asciiLower), as: UTF8.self)
        let rest: Substring
        if lower.hasPrefix("https://") {
            rest = lower.dropFirst(8)
        } else if lower.hasPrefix("http://") {
            rest = lower.dropFirst(7)
        } else {
            return false
        }
        var host = rest
        var port: Substring = ""
        if rest.hasPrefix("[") {
            guard let close = rest.firstIndex(of: "]") else { return false }
            host = rest[rest.index(after: rest.startIndex)..<close]
            let after = rest[rest.index(after: close)...]
            guard host.allSatisfy({ $0.isHexDigit || $0 == ":" || $0 == "." }), !host.isEmpty else { return false }
            if after.isEmpty { return true }
            guard after.hasPrefix(":") else { return false }
            port = after.dropFirst()
        } else {
            if let colon = rest.firstIndex(of: ":") {
                host = rest[..<colon]
                port = rest[rest.index(after: colon)...]
                if port.isEmpty { return false }
            }
            guard !host.isEmpty,
                host.utf8.allSatisfy({ byte in
                    (byte >= UInt8(ascii: "a") && byte <= UInt8(ascii: "z"))
                        || (byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9"))
                        || byte == UInt8(ascii: "-") || byte == UInt8(ascii: ".")
                })
            else { return false }
            if port.isEmpty { return true }
        }
        return (1...5).contains(port.count) && port.allSatisfy(\.isASCII) && port.allSatisfy(\.isNumber)
            && (Int(port).map { $0 <= 65535 } ?? false)
    }
}

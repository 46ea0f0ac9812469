import ForgePushTokenOwner

@testable import TokenService
import HTTPServing

/// The pure decoders fuzzed directly, whatever the route: `RequestBodies` on every request's
/// `Content-Type` and body, `HTTPRequest`'s target split, and the parsers of the credentials
/// and origins that requests carry.
enum BodyChecks {
    static func run(_ raw: RawRequest) {
        let context = Context(raw: raw)
        targetSplit(raw.target, context: context)
        let contentType = raw.headers["Content-Type"]
        mediaType(contentType, context: context)
        deviceToken(contentType: contentType, body: raw.body, context: context)
        registrationFailure(contentType: contentType, body: raw.body, context: context)
        if let origin = raw.headers["Origin"] { originPolicy(origin, context: context) }
        if let authorization = raw.headers["Authorization"] { bearerToken(authorization, context: context) }
    }

    /// `HTTPRequest(target:)`: "split at the first `?`", and "a query string never changes routing".
    static func targetSplit(_ target: String, context: Context) {
        let request = HTTPRequest(method: "GET", target: target)
        let bytes = Array(target.utf8)
        if let mark = bytes.firstIndex(of: UInt8(ascii: "?")) {
            require(Array(request.path.utf8) == Array(bytes[..<mark])
                        && request.query.map { Array($0.utf8) } == Array(bytes[(mark + 1)...]),
                    "HTTPRequest(target:) did not split at the first '?': path \(String(reflecting: request.path)), query \(String(reflecting: request.query))",
                    context: context.description, name: "target-split")
        } else {
            require(request.path == target && request.query == nil, "a target without '?' was changed", context: context.description)
        }
    }

    /// `mediaType`: the ASCII fast path gives what the general (Character) path gives.
    static func mediaType(_ contentType: String?, context: Context) {
        let media = RequestBodies.mediaType(contentType)
        guard let contentType else {
            require(media == nil, "no Content-Type gave a media type", context: context.description)
            return
        }
        let type = contentType.split(separator: ";", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
        let general = String(type.trimmingASCIIWhitespace()).lowercased()
        if contentType.utf8.allSatisfy({ $0 < 0x80 }) {
            require(media == general, "mediaType's ASCII path gave \(String(reflecting: media)), the general path \(String(reflecting: general))",
                    context: context.description, name: "media-type")
        }
        require(media.map { !$0.contains(";") } ?? false, "a media type kept its parameters: \(String(reflecting: media))", context: context.description)
    }

    /// `deviceTokenHex(contentType:body:)`: 2 to 512 lowercase hex digits (1 to 256 bytes) or
    /// `invalid_token`; the plain-hex fast path agrees with the general one.
    static func deviceToken(contentType: String?, body: [UInt8], context: Context) {
        let media = RequestBodies.mediaType(contentType)
        do {
            let token = try RequestBodies.deviceTokenHex(contentType: contentType, body: body)
            let digits = token.utf8.count
            require(digits % 2 == 0 && (2...2 * TokenState.maxTokenBytes).contains(digits) && isStoredToken(token),
                    "a decoded token is \(String(reflecting: token))", context: context.description)
            if media == "application/octet-stream" {
                require(token == lowercaseHex(body), "an octet-stream token is not the body", context: context.description)
            }
        } catch {
            require(error.error == "invalid_token" && !error.message.isEmpty,
                    "deviceTokenHex threw \(String(reflecting: error))", context: context.description)
            require(media != "application/octet-stream" || body.isEmpty || body.count > TokenState.maxTokenBytes,
                    "an octet-stream body of \(body.count) bytes was refused", context: context.description)
        }
        if let plain = RequestBodies.plainHexText(body) {
            let general = (try? RequestBodies.hexToken(Substring(String(decoding: body, as: UTF8.self)))).map(lowercaseHex)
            require(general == plain, "plainHexText gave \(plain), hexToken \(String(reflecting: general))",
                    context: context.description, name: "plain-hex")
        }
    }

    /// `registrationFailure(contentType:body:)`: a failure or `invalid_request`; an empty body is
    /// "unknown error" and a non-JSON UTF-8 body is the message itself.
    static func registrationFailure(contentType: String?, body: [UInt8], context: Context) {
        let media = RequestBodies.mediaType(contentType)
        do {
            let failure = try RequestBodies.registrationFailure(contentType: contentType, body: body)
            _ = failure.description
            if body.isEmpty {
                require(failure.message == "unknown error", "an empty /fail body gave \(String(reflecting: failure.message))", context: context.description)
            } else if media != "application/json" {
                require(Array(failure.message.utf8) == body, "a text /fail body is not the message", context: context.description)
            }
        } catch {
            require(error.error == "invalid_request" && !error.message.isEmpty,
                    "registrationFailure threw \(String(reflecting: error))", context: context.description)
            require(!body.isEmpty, "an empty /fail body was refused", context: context.description)
            if media != "application/json" {
                require(String(validating: body, as: UTF8.self) == nil, "a UTF-8 text /fail body was refused", context: context.description)
            }
        }
    }

    /// `CrossOriginPolicy(origins:)` on a request's `Origin`: an accepted origin is then allowed,
    /// and answered in its configured (lower-case) spelling, whatever the request's case.
    static func originPolicy(_ origin: String, context: Context) {
        guard let policy = try? CrossOriginPolicy(origins: [origin]) else { return }
        require(policy.allowOriginValue(for: origin) == (origin == "*" ? "*" : origin.lowercased()),
                "an origin the policy accepted is not allowed: \(String(reflecting: origin))", context: context.description)
    }

    /// `BearerAuthentication(token:)` on a request's `Authorization` value: a token it accepts is
    /// then authorized, both as `Authorization: Bearer` and as `access_token` percent-encoded.
    static func bearerToken(_ value: String, context: Context) {
        guard let authentication = BearerAuthentication(token: value, scope: .all) else { return }
        require(authentication.check(authorization: "Bearer " + value, query: nil, method: "POST").isAuthorized,
                "a valid bearer token did not authorize itself: \(String(reflecting: value))", context: context.description)
        var encoded = "access_token="
        for byte in value.utf8 {
            encoded += byte == UInt8(ascii: "+") || byte == UInt8(ascii: "/") || byte == UInt8(ascii: "=")
                ? "%" + String(byte, radix: 16, uppercase: true) : String(UnicodeScalar(byte))
        }
        require(authentication.check(authorization: nil, query: "x=1&" + encoded, method: "GET").isAuthorized,
                "a valid token in access_token did not authorize: \(String(reflecting: encoded))", context: context.description)
        require(authentication.check(authorization: nil, query: encoded, method: "POST") == .missing,
                "access_token authorized a POST", context: context.description)
    }
}

/// A request's description for a failure message, built only when one is printed.
struct Context: CustomStringConvertible {
    let raw: RawRequest
    var description: String {
        describe(HTTPRequest(method: raw.method, target: raw.target, headers: raw.headers, body: raw.body))
            + " (target \(String(reflecting: raw.target)))"
    }
}

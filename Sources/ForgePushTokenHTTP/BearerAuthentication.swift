/// Bearer-token authentication of requests (RFC 6750): the service is started with one secret,
/// and protected routes need `Authorization: Bearer <secret>` or, for `GET` and `HEAD`, the query
/// parameter `access_token=<secret>` (RFC 6750 §2.3; a browser's `EventSource` cannot send header
/// fields). The probes (`/healthz`, `/livez`, `/readyz`) are never protected.
///
/// The comparison takes the same time whatever the sent value shares with the secret, so the
/// secret cannot be guessed byte by byte from response times. The secret is never part of a
/// description, log line or error message.
///
/// A value type; `Sendable`.
public struct BearerAuthentication: Sendable {
    /// Which routes need the token.
    public enum Scope: String, Sendable, CaseIterable {
        /// `POST /register` and `POST /fail` (the default).
        case writes
        /// Every route but the probes: also `/token`, `/token/stream`, `/metrics` and `/`.
        case all
    }

    /// Which routes need the token.
    public let scope: Scope
    private let secret: [UInt8]

    /// The realm named in `WWW-Authenticate` (RFC 6750 §3).
    public static let realm = "forge-push-token"

    /// Creates the policy, or `nil` when `token` is not a `b64token` of RFC 6750 §2.1 (1 or more of
    /// `A–Z a–z 0–9 - . _ ~ + /`, then any number of `=`), the only form a Bearer credential can take.
    public init?(token: String, scope: Scope = .writes) {
        guard Self.isValidToken(token) else { return nil }
        self.secret = Array(token.utf8)
        self.scope = scope
    }

    /// Whether `token` has the `b64token` syntax of RFC 6750 §2.1.
    public static func isValidToken(_ token: String) -> Bool {
        let bytes = Array(token.utf8)
        let body = bytes.prefix { $0 != UInt8(ascii: "=") }
        guard !body.isEmpty, bytes[body.count...].allSatisfy({ $0 == UInt8(ascii: "=") }) else { return false }
        return body.allSatisfy { byte in
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"):
                true
            case UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"), UInt8(ascii: "+"),
                UInt8(ascii: "/"):
                true
            default:
                false
            }
        }
    }

    /// Whether a request for `route` needs the token under this scope (the route table's
    /// `Route.access`).
    public func protects(_ route: Route) -> Bool {
        switch route.access {
        case .open: false
        case .token: true
        case .tokenUnderScopeAll: scope == .all
        }
    }

    /// The outcome of checking one request's credentials.
    public enum Outcome: Sendable, Equatable {
        /// The token matched.
        case authorized
        /// No credentials were sent.
        case missing
        /// Credentials were sent but did not match, or were malformed.
        case invalid
    }

    /// Checks the credentials of a request: the `Authorization` field's value, else (only for
    /// `GET` and `HEAD`, per the service's contract) the `access_token` query parameter.
    /// - Parameters:
    ///   - authorization: the `Authorization` header field, or `nil`. The scheme name `Bearer` is
    ///     case-insensitive (RFC 9110 §11.1); one or more spaces follow it.
    ///   - query: the request's query string without `?`, or `nil`.
    ///   - method: the request method.
    public func check(authorization: String?, query: String?, method: String) -> Outcome {
        if let authorization {
            let value = authorization.utf8
            guard value.count > 7, value.prefix(6).elementsEqual("bearer".utf8, by: { asciiLower($0) == $1 }),
                value.dropFirst(6).first == UInt8(ascii: " ")
            else { return .invalid }
            let credentials = value.dropFirst(6).drop { $0 == UInt8(ascii: " ") }
            return Self.constantTimeEquals(credentials, secret) ? .authorized : .invalid
        }
        guard method == "GET" || method == "HEAD", let query,
            let sent = RequestBodies.formField("access_token", in: query)
        else { return .missing }
        guard let decoded = RequestBodies.percentDecoded(sent) else { return .invalid }
        return Self.constantTimeEquals(decoded.utf8, secret) ? .authorized : .invalid
    }

    /// The 401 answer to a request whose check gave `outcome` (`.missing` or `.invalid`): code
    /// `unauthorized` with `WWW-Authenticate: Bearer realm="…"`, plus `error="invalid_token"` when
    /// a wrong token was sent (RFC 6750 §3). The message names the `access_token` query parameter
    /// only to a `GET` or `HEAD`, the only methods that may use it.
    public static func unauthorized(_ outcome: Outcome, method: String) -> HTTPResponse {
        var challenge = "Bearer realm=\"\(realm)\""
        let message: String
        if outcome == .invalid {
            challenge += ", error=\"invalid_token\""
            message = "the bearer token is not the service's token"
        } else {
            message =
                "send the service's token as 'Authorization: Bearer <token>'"
                + (method == "GET" || method == "HEAD" ? " or as the access_token query parameter" : "")
        }
        return .error(401, ServiceError("unauthorized", message), headers: ["WWW-Authenticate": challenge])
    }

    /// Compares `sent` with `secret` in time that depends on `sent`'s length only, never on where
    /// the two first differ; a different length is a mismatch, found in the same loop.
    static func constantTimeEquals(_ sent: some Collection<UInt8>, _ secret: [UInt8]) -> Bool {
        var difference: UInt8 = sent.count == secret.count ? 0 : 1
        guard !secret.isEmpty else { return false }
        var index = 0
        for byte in sent {
            difference |= byte ^ secret[index % secret.count]
            index += 1
        }
        return difference == 0
    }
}

extension BearerAuthentication: CustomStringConvertible {
    /// `Bearer authentication (scope writes)`: never the token.
    public var description: String { "Bearer authentication (scope \(scope.rawValue))" }
}

/// The routes of the HTTP API (http-api.md, "Routes"), matched on the path alone: the query string
/// never changes routing.
public enum Route: String, Sendable, CaseIterable {
    /// `POST /register`: `didRegister(deviceToken:)`.
    case register = "/register"
    /// `POST /fail`: `didFailToRegister(error:)`.
    case fail = "/fail"
    /// `GET` / `HEAD /token`: the current token.
    case token = "/token"
    /// `GET` / `HEAD /token/stream`: the token as Server-Sent Events.
    case stream = "/token/stream"
    /// `GET` / `HEAD /healthz`: liveness.
    case healthz = "/healthz"
    /// `GET` / `HEAD /metrics`: Prometheus metrics.
    case metrics = "/metrics"
    /// `GET` / `HEAD /`: the live page.
    case page = "/"

    /// The route of `path`, or `nil` (404).
    public init?(path: String) {
        self.init(rawValue: path)
    }

    /// The methods the route accepts, as listed in a 405's `Allow` header (RFC 9110 §10.2.1).
    /// Every route also answers `OPTIONS` (RFC 9110 §9.3.7; CORS preflight requests).
    public var allowedMethods: [String] {
        switch self {
        case .register, .fail: ["POST", "OPTIONS"]
        case .token, .stream, .healthz, .metrics, .page: ["GET", "HEAD", "OPTIONS"]
        }
    }
}

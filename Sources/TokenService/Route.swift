import HTTPServing
import ServerSupport

/// The routes of the HTTP API (http-api.md, "Routes"), matched on the path alone: the query string
/// never changes routing. The route table: each route's path, its methods (`allowedMethods`) and
/// who may call it (`access`); `Responder.respond(to:body:)` dispatches each to its handler
/// (docs/architecture.md, "Adding a route").
public enum Route: String, Sendable, CaseIterable {
    /// `POST /register`: `didRegister(deviceToken:)`.
    case register = "/register"
    /// `POST /fail`: `didFailToRegister(error:)`.
    case fail = "/fail"
    /// `GET` / `HEAD /token`: the current token.
    case token = "/token"
    /// `GET` / `HEAD /token/stream`: the token as Server-Sent Events.
    case stream = "/token/stream"
    /// `GET` / `HEAD /healthz`: the service's health (503 while starting, draining or stopping).
    case healthz = "/healthz"
    /// `GET` / `HEAD /livez`: liveness, which depends on nothing (docs/operations.md).
    case livez = "/livez"
    /// `GET` / `HEAD /readyz`: readiness: `/healthz`'s answer, and 503 `draining` while draining.
    case readyz = "/readyz"
    /// `GET` / `HEAD /metrics`: Prometheus metrics.
    case metrics = "/metrics"
    /// `GET` / `HEAD /`: the live page.
    case page = "/"

    /// The route of `path`, or `nil` (404). A `switch` over the paths rather than
    /// `init(rawValue:)`, whose synthesized body searches a table of the raw values through the
    /// standard library's generic string-switch helper on every request; every path here is a
    /// small string (at most 15 bytes), which `==` compares in place.
    public init?(path: String) {
        switch path {
        case "/register": self = .register
        case "/fail": self = .fail
        case "/token": self = .token
        case "/token/stream": self = .stream
        case "/healthz": self = .healthz
        case "/livez": self = .livez
        case "/readyz": self = .readyz
        case "/metrics": self = .metrics
        case "/": self = .page
        default: return nil
        }
    }

    /// Who may call a route when the service has tokens (`--auth-token`, `--auth-scope`, or
    /// `--write-token-file` and `--read-token-file`; docs/operations.md, "Read and write tokens").
    public enum Access: Sendable, Equatable {
        /// Anyone, always (`/healthz`, `/livez`, `/readyz`, for probes).
        case open
        /// Only with a write token, whenever the service has tokens (the writes).
        case write
        /// With a read or a write token when reads are protected (`--auth-scope all`, or a
        /// read-token file), else anyone (the reads).
        case read
    }

    /// Who may call the route (`BearerAuthentication.protects(_:)`).
    public var access: Access {
        switch self {
        case .healthz, .livez, .readyz: .open
        case .register, .fail: .write
        case .token, .stream, .metrics, .page: .read
        }
    }

    /// The methods the route accepts, as listed in a 405's `Allow` header (RFC 9110 §10.2.1).
    /// Every route also answers `OPTIONS` (RFC 9110 §9.3.7; CORS preflight requests).
    public var allowedMethods: [String] {
        switch self {
        case .register, .fail: ["POST", "OPTIONS"]
        case .token, .stream, .healthz, .livez, .readyz, .metrics, .page: ["GET", "HEAD", "OPTIONS"]
        }
    }
}

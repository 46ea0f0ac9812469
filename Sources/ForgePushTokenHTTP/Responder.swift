import ForgePushToken

/// Maps each request of the HTTP API to the manager's calls and a response (http-api.md).
///
/// Plain routes are answered by `respond(to:)` with a complete `HTTPResponse`. `GET
/// /token/stream` answers `.eventStream`; the engine then calls `openEventStream(wake:)`, which
/// registers a subscriber or refuses with a 503.
///
/// Thread-safety: all members may be called from any thread, concurrently.
public final class Responder: Sendable {
    /// What to send for one request.
    public enum Reply: Sendable {
        /// A complete response.
        case response(HTTPResponse)
        /// Start an event stream: call `openEventStream(wake:)`.
        case eventStream
    }

    /// The service state behind the routes.
    public let service: TokenService
    /// The subscribers of the event stream.
    public let hub: EventHub
    /// The service's counters, served at `GET /metrics`.
    public let metrics = ServiceMetrics()
    /// Seconds a refused subscriber is told to wait (`Retry-After`).
    public let retryAfterSeconds = 5
    private let stopping = Locked(false)

    /// Who may call which route; `nil` when the service runs without a token.
    public let authentication: BearerAuthentication?
    /// Which other origins' browser pages may read the responses.
    public let crossOrigin: CrossOriginPolicy
    /// Where failures the client cannot fix are logged (a state file that cannot be written).
    public let log: ServerLog?

    /// Creates a responder over `service`, admitting at most `maxSubscribers` event streams.
    /// - Parameters:
    ///   - authentication: the bearer token and its scope, or `nil` for an open service.
    ///   - crossOrigin: the origins allowed to read responses from a browser (default none).
    ///   - log: where a state file that cannot be written is reported (default: nowhere).
    public init(service: TokenService, maxSubscribers: Int, authentication: BearerAuthentication? = nil,
                crossOrigin: CrossOriginPolicy = CrossOriginPolicy(), log: ServerLog? = nil) {
        self.service = service
        self.hub = EventHub(service: service, maxSubscribers: maxSubscribers)
        self.authentication = authentication
        self.crossOrigin = crossOrigin
        self.log = log
    }

    /// Whether `GET /token` may be answered without looking at the request's header fields: no
    /// token protects it and no CORS header field depends on its `Origin`. The engine's
    /// allocation-free path for that request is only taken when this holds.
    public var answersTokenReadsBlindly: Bool {
        authentication?.protects(.token) != true && !crossOrigin.isEnabled
    }

    /// Marks the service as stopping: `/healthz` answers 503 and the hub ends every stream and
    /// refuses new ones. Idempotent.
    public func beginShutdown() {
        stopping.withLock { $0 = true }
        hub.close()
    }

    /// Whether `beginShutdown()` was called.
    public var isStopping: Bool { stopping.withLock { $0 } }

    /// The answer that a request's head (method, target, header fields) alone decides, before its
    /// body is read: 404 for an unknown path, the answer to `OPTIONS`, 405 for a method the path
    /// does not take, 401 when the route needs the bearer token and the request lacks it; `nil`
    /// when the request goes on. The engine calls it as soon as the header fields have arrived,
    /// so that a refused request's body is never kept; `respond(to:)` checks the same again.
    public func headResponse(to request: HTTPRequest) -> HTTPResponse? {
        guard let route = Route(path: request.path) else {
            return .error(404, ServiceError("not_found", "no route for \(request.path)"))
        }
        let method = request.method
        if method == "OPTIONS" { return crossOrigin.options(for: route, request: request) }
        guard route.allowedMethods.contains(method) else {
            let allow = route.allowedMethods.joined(separator: ", ")
            return .error(405, ServiceError("method_not_allowed", "\(route.rawValue) accepts \(allow)"),
                          headers: ["Allow": allow])
        }
        if let authentication, authentication.protects(route) {
            let outcome = authentication.check(authorization: request.headers["Authorization"], query: request.query,
                                               method: method)
            if outcome != .authorized {
                metrics.increment(.unauthorizedRequests)
                return BearerAuthentication.unauthorized(outcome)
            }
        }
        return nil
    }

    /// The reply to `request`. Never throws: every failure is an error response. A response to an
    /// allowed cross-origin request carries the CORS header fields.
    public func respond(to request: HTTPRequest) -> Reply {
        let origin = request.headers["Origin"]
        if let early = headResponse(to: request) {
            return .response(crossOrigin.decorate(early, origin: origin))
        }
        switch reply(to: request) {
        case .response(let response): return .response(crossOrigin.decorate(response, origin: origin))
        case .eventStream: return .eventStream
        }
    }

    private func reply(to request: HTTPRequest) -> Reply {
        guard let route = Route(path: request.path) else { preconditionFailure("headResponse answers unknown paths") }
        let method = request.method
        switch route {
        case .register:
            return .response(register(request))
        case .fail:
            return .response(fail(request))
        case .token:
            return .response(Self.tokenResponse(service.snapshot))
        case .stream:
            if method == "HEAD" { return .response(HTTPResponse(status: 200, headers: ServerSentEvents.responseHeaders)) }
            return .eventStream
        case .healthz:
            return .response(isStopping ? Self.shuttingDown : service.isDegraded ? Self.degraded : Self.healthy)
        case .metrics:
            let text = metrics.render(subscribers: hub.count, events: hub.eventCounts, maxSubscribers: hub.maxSubscribers,
                                      stateSaved: service.savesState ? !service.isDegraded : nil)
            return .response(HTTPResponse(status: 200, headers: ["Content-Type": ServiceMetrics.contentType,
                                                                 "Cache-Control": "no-store"],
                                          body: Array(text.utf8)))
        case .page:
            return .response(HTTPResponse(status: 200, headers: ["Content-Type": LivePage.contentType],
                                          body: LivePage.html))
        }
    }

    /// The answer to `GET /token` at `snapshot`: 200, its pre-rendered body, `Cache-Control:
    /// no-store`. The engine may build it once per version and reuse it for every request.
    public static func tokenResponse(_ snapshot: TokenSnapshot) -> HTTPResponse {
        .json(200, snapshot.tokenBody, headers: ["Cache-Control": "no-store"])
    }

    private static let healthy = HTTPResponse.json(200, encoding: ["status": "ok"])
    private static let shuttingDown = HTTPResponse.json(503, encoding: ["status": "shutting_down"])
    /// Serving, but the last change could not be saved to the state file.
    private static let degraded = HTTPResponse.json(200, encoding: ["status": "degraded"])

    /// Registers an event-stream subscriber whose first event is the current token.
    /// - Parameters:
    ///   - origin: the request's `Origin` field, for the CORS header fields of the answer.
    ///   - wake: resumes the subscriber's connection (see `EventSubscriber`).
    /// - Returns: the response head (200 with the SSE header fields) and the subscriber, or a 503
    ///   (`too_many_subscribers` with `Retry-After`, or `shutting_down`) and `nil`.
    public func openEventStream(origin: String? = nil,
                                wake: @escaping @Sendable () -> Void) -> (HTTPResponse, EventSubscriber?) {
        let (head, subscriber) = subscribe(wake: wake)
        return (crossOrigin.decorate(head, origin: origin), subscriber)
    }

    private func subscribe(wake: @escaping @Sendable () -> Void) -> (HTTPResponse, EventSubscriber?) {
        do {
            let subscriber = try hub.subscribe(wake: wake)
            return (HTTPResponse(status: 200, headers: ServerSentEvents.responseHeaders), subscriber)
        } catch .full {
            let error = ServiceError("too_many_subscribers",
                                     "the service has \(hub.maxSubscribers) subscribers already; retry later")
            return (.error(503, error, headers: ["Retry-After": String(retryAfterSeconds)]), nil)
        } catch {
            return (.error(503, ServiceError("shutting_down", "the service is stopping"),
                           headers: ["Retry-After": String(retryAfterSeconds)]), nil)
        }
    }

    private func register(_ request: HTTPRequest) -> HTTPResponse {
        do {
            let token = try RequestBodies.deviceToken(contentType: request.headers["Content-Type"], body: request.body)
            let change = service.register(deviceToken: token)
            metrics.increment(.registrationsAccepted)
            return answer(change)
        } catch {
            metrics.increment(.registrationsRejected)
            return .error(400, error)
        }
    }

    private func fail(_ request: HTTPRequest) -> HTTPResponse {
        do {
            let failure = try RequestBodies.registrationFailure(contentType: request.headers["Content-Type"],
                                                                body: request.body)
            let change = service.fail(error: failure)
            metrics.increment(.failuresReported)
            return answer(change)
        } catch {
            return .error(400, error)
        }
    }

    /// Publishes a change to the subscribers and answers it: 200 `{"changed":…,"token":…}`, or 503
    /// `state_not_saved` when the state file could not be written (the change stays in memory and
    /// is published all the same: it is the service's state now).
    private func answer(_ change: TokenService.Change) -> HTTPResponse {
        if change.changed {
            metrics.increment(.tokenChanges)
            hub.publish(change.snapshot)
        }
        if let failure = change.saveFailure {
            log?.log(.error, "\(failure); the service is degraded until a write succeeds")
            return .error(503, ServiceError("state_not_saved",
                                            "the token is in memory but could not be saved to the state file; see the service's log"))
        }
        return .json(200, change.snapshot.changeBody(changed: change.changed))
    }

    /// The 414 for a request target over `limit` bytes (RFC 9110 §15.5.15: `uri_too_long`).
    public static func uriTooLong(limit: Int) -> HTTPResponse {
        .error(414, ServiceError("uri_too_long", "the request target is over \(limit) bytes"))
    }

    /// The 413 for a body over `limit` bytes (http-api.md: `payload_too_large`).
    public static func payloadTooLarge(limit: Int) -> HTTPResponse {
        .error(413, ServiceError("payload_too_large", "the request body is over \(limit) bytes"))
    }
}

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

    /// Creates a responder over `service`, admitting at most `maxSubscribers` event streams.
    public init(service: TokenService, maxSubscribers: Int) {
        self.service = service
        self.hub = EventHub(service: service, maxSubscribers: maxSubscribers)
    }

    /// Marks the service as stopping: `/healthz` answers 503 and the hub ends every stream and
    /// refuses new ones. Idempotent.
    public func beginShutdown() {
        stopping.withLock { $0 = true }
        hub.close()
    }

    /// Whether `beginShutdown()` was called.
    public var isStopping: Bool { stopping.withLock { $0 } }

    /// The reply to `request`. Never throws: every failure is an error response.
    public func respond(to request: HTTPRequest) -> Reply {
        guard let route = Route(path: request.path) else {
            return .response(.error(404, ServiceError("not_found", "no route for \(request.path)")))
        }
        let method = request.method
        guard route.allowedMethods.contains(method) else {
            let allow = route.allowedMethods.joined(separator: ", ")
            return .response(.error(405, ServiceError("method_not_allowed", "\(route.rawValue) accepts \(allow)"),
                                    headers: ["Allow": allow]))
        }
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
            let text = metrics.render(subscribers: hub.count, events: hub.eventCounts)
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
    /// - Parameter wake: resumes the subscriber's connection (see `EventSubscriber`).
    /// - Returns: the response head (200 with the SSE header fields) and the subscriber, or a 503
    ///   (`too_many_subscribers` with `Retry-After`, or `shutting_down`) and `nil`.
    public func openEventStream(wake: @escaping @Sendable () -> Void) -> (HTTPResponse, EventSubscriber?) {
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
        guard change.changed else { return .json(200, change.snapshot.changeBody(changed: false)) }
        metrics.increment(.tokenChanges)
        hub.publish(change.snapshot)
        if let failure = change.saveFailure {
            return .error(503, ServiceError("state_not_saved", "the change is in memory but was not saved: \(failure)"))
        }
        return .json(200, change.snapshot.changeBody(changed: true))
    }

    /// The 413 for a body over `limit` bytes (http-api.md: `payload_too_large`).
    public static func payloadTooLarge(limit: Int) -> HTTPResponse {
        .error(413, ServiceError("payload_too_large", "the request body is over \(limit) bytes"))
    }
}

import ForgePushToken
import ForgePushTokenOwner
import ServiceLogging

/// The HTTP API (docs/http-api.md, `openapi.yaml`) over the `TokenOwner`: the routes. An engine
/// serves it through `HTTPApplication` (Responder+HTTPApplication.swift), and nothing else.
///
/// Per request: `admit(_:)` once the head has arrived (the route is matched and the head checked
/// here, once: 404, `OPTIONS`, 405, 401, 403), then `respond(to:)` with the admitted request and
/// its body, which answers at once, asks for an event stream (`openEventStream`), or answers later
/// (a `PendingResponse`, for a write the store decides on its own thread); at the end
/// `recordFinished(_:)`. The CORS header fields are not added here: the engine adds them to every
/// answer, its own included, where it completes each answer's header
/// (`ResponseHeaders.completing(_:crossOrigin:origin:)`, with `crossOrigin`).
///
/// Thread-safety: all members may be called from any thread, concurrently.
public final class Responder: Sendable {
    /// What to send for one admitted request (`HTTPReply`).
    public typealias Reply = HTTPReply
    /// What the head of a request decided (`HTTPAdmission`).
    public typealias Admission = HTTPAdmission

    /// The one owner of the token and its subscribers. No engine sees it: an engine asks this
    /// responder (`HTTPApplication`), which asks the owner; `Service` drives its shutdown.
    public let owner: TokenOwner<TokenSnapshot>
    /// The service's counters, served at `GET /metrics`.
    public let metrics = ServiceMetrics()
    /// Events sent to and skipped by every subscriber, past and present.
    public let deliveries = DeliveryTally()
    /// Seconds a refused subscriber is told to wait (`Retry-After`).
    public let retryAfterSeconds = 5
    /// Who may call which route, with the token sets in force; `nil` when the service runs
    /// without a token. Replaced as a whole by `replaceCredentials(_:)`; which routes need a token
    /// (`scope`) never changes. Kept per thread (`PerThreadLocked`, the same value in every
    /// shard), so that the writes' check takes no lock another request thread takes.
    let credentials: PerThreadLocked<BearerAuthentication>?
    /// Whether the reads need a token (scope `all`, or a read-token file): fixed at start.
    let readsNeedToken: Bool
    /// Which other origins' browser pages may read the responses: the engine completes every
    /// answer's header with it (`ResponseHeaders.completing(_:crossOrigin:origin:)`).
    public let crossOrigin: CrossOriginPolicy
    /// Where failures and (with `accessLog`) finished requests are logged.
    let log: ServerLog?
    /// Whether every finished request is logged (`--access-log`).
    public let accessLog: Bool
    /// The replica mode (docs/replicas.md), or `nil` for a service that runs alone.
    let replica: ReplicaMode?
    /// Whether the service is draining (`beginDraining()`): its own lock, so that probes never
    /// take the owner's.
    private let draining = Locked(false)
    /// Each open stream's age limit (`--max-stream-age`), behind its own lock.
    private let ageLimits: Locked<StreamAgeLimits>

    /// Creates the responder over `owner`.
    /// - Parameters:
    ///   - authentication: the bearer token and its scope, or `nil` for an open service.
    ///   - crossOrigin: the origins allowed to read responses from a browser (default none).
    ///   - log: where failures, registration failures and the access log go (default: nowhere).
    ///   - accessLog: whether to log one line per finished request.
    ///   - replica: the replica mode, when the token is shared with other replicas (default none).
    ///   - maxStreamAge: `--max-stream-age` in seconds: 0 (off, the default), or 60 to 86,400
    ///     (`StreamAgeLimits.range`); each stream draws its own limit from [A/2, A].
    public init(
        owner: TokenOwner<TokenSnapshot>, authentication: BearerAuthentication? = nil,
        crossOrigin: CrossOriginPolicy = CrossOriginPolicy(), log: ServerLog? = nil, accessLog: Bool = false,
        replica: ReplicaMode? = nil, maxStreamAge: Int = 0
    ) {
        self.owner = owner
        self.replica = replica
        self.credentials = authentication.map { authentication in PerThreadLocked { authentication } }
        self.readsNeedToken = authentication?.protects(.token) == true
        self.ageLimits = Locked(StreamAgeLimits(seconds: maxStreamAge))
        self.crossOrigin = crossOrigin
        self.log = log
        self.accessLog = accessLog
    }

    // MARK: Requests

    /// Whether `GET /token` may be answered without looking at the request's header fields: no
    /// token protects it and no CORS header field depends on its `Origin`. The engine's
    /// allocation-free path for that request is only taken when this holds (it reads
    /// `If-None-Match` itself, in place, for the 304).
    public var answersTokenReadsBlindly: Bool {
        !readsNeedToken && !crossOrigin.isEnabled
            && (replica == nil || owner.health == .ok)
    }

    /// Decides what a request's head (method, target, header fields) alone decides, before its
    /// body is read: 404 for an unknown path, the answer to `OPTIONS`, 405 for a method the path
    /// does not take, 401 when the route needs a bearer token and the request has none of the
    /// service's, 403 `insufficient_scope` for a write sent with a read token. The
    /// engine calls it once, as soon as the header fields have arrived, so that a refused
    /// request's body is never kept.
    public func admit(_ head: consuming HTTPRequest) -> Admission {
        guard let route = Route(path: head.path) else {
            return .answer(.error(404, ServiceError("not_found", "no route for \(head.path)")), route: nil)
        }
        let method = head.method
        if method == "OPTIONS" {
            return .answer(crossOrigin.options(for: route, request: head), route: route)
        }
        guard route.allowedMethods.contains(method) else {
            let allow = route.allowedMethods.joined(separator: ", ")
            return .answer(
                .error(
                    405, ServiceError("method_not_allowed", "\(route.rawValue) accepts \(allow)"),
                    headers: ["Allow": allow]), route: route)
        }
        guard let credentials, route.access == .write || (route.access == .read && readsNeedToken) else {
            return .proceed(AdmittedRequest(route: route, request: head))
        }
        let outcome = credentials.withThreadLock { $0 }.check(
            authorization: head.headers["Authorization"], query: head.query, method: method)
        guard case .authorized(let grant) = outcome else {
            metrics.increment(.unauthorizedRequests)
            return .answer(BearerAuthentication.unauthorized(outcome, method: method), route: route)
        }
        if route.access == .write && grant.role != .write {
            metrics.increment(.forbiddenRequests)
            return .answer(BearerAuthentication.insufficientScope, route: route)
        }
        return .proceed(AdmittedRequest(route: route, request: head, grant: grant))
    }

    /// The reply to an admitted request. Never throws: every failure is an error response.
    public func respond(to admitted: AdmittedRequest) -> Reply {
        let request = admitted.request
        switch admitted.route {
        case .register:
            do {
                let token = try RequestBodies.deviceTokenHex(
                    contentType: request.headers["Content-Type"], body: request.body)
                metrics.increment(.registrationsAccepted)
                return write(token)
            } catch {
                metrics.increment(.registrationsRejected)
                return .response(.error(400, error))
            }
        case .fail:
            do {
                let failure = try RequestBodies.registrationFailure(
                    contentType: request.headers["Content-Type"],
                    body: request.body)
                metrics.increment(.failuresReported)
                log?.log(.error, "registration failed: \(failure)")
                return write(nil)
            } catch {
                return .response(.error(400, error))
            }
        case .token:
            if let replica {
                return .response(replica.decorate(answerTokenRequest(request), health: owner.health))
            }
            return .response(answerTokenRequest(request))
        case .stream:
            if request.method == "HEAD" {
                return .response(HTTPResponse(status: 200, headers: ServerSentEvents.responseHeaders))
            }
            return .eventStream
        case .healthz:
            return .response(health())
        case .livez:
            return .response(Self.alive)
        case .readyz:
            return .response(health())
        case .metrics:
            let store = owner.store.status()
            let stateSaved = store.durableWrites != nil ? owner.health != .degraded(reason: .stateNotSaved) : nil
            let text =
                metrics.render(
                    subscribers: owner.subscriberCount, events: deliveries.counts,
                    maxSubscribers: owner.maxSubscribers, stateSaved: stateSaved, draining: isDraining,
                    tokens: currentCredentials.map { ($0.tokenCount(.read), $0.tokenCount(.write)) } ?? (0, 0))
                // The store's own series: Redis' in replica mode, the state file's writes alone.
                + (replica?.metrics() ?? store.metricsText)
            return .response(
                HTTPResponse(
                    status: 200,
                    headers: [
                        "Content-Type": ServiceMetrics.contentType,
                        "Cache-Control": "no-store",
                    ],
                    body: Array(text.utf8)))
        case .page:
            return .response(pageRead(request))
        }
    }

    /// Commits `token` through the owner (`TokenOwner.commit(_:)`), answering now when the store
    /// decided at once (a local store: no pending response, no closure); else through a
    /// `PendingResponse`, made only then.
    private func write(_ token: String?) -> Reply {
        switch owner.commit(token) {
        case .decided(let outcome):
            return .response(answer(outcome))
        case .pending(let commit):
            let later = PendingResponse()
            if let outcome = commit.outcome(orWhenDecided: { [self] outcome in later.fulfil(answer(outcome)) }) {
                return .response(answer(outcome))
            }
            return .later(later)
        }
    }

    /// The answer to a commit: 200 `{"changed":…,"token":…}`; 503 `state_not_saved` when the
    /// change could not be made durable (it is then neither served nor streamed; the client
    /// retries); 503 `store_unavailable` with `Retry-After` when the store could not decide.
    private func answer(_ outcome: CommitOutcome) -> HTTPResponse {
        if outcome.changed { metrics.increment(.tokenChanges) }
        switch outcome {
        case .applied(let state), .unchanged(let state):
            return .json(200, TokenSnapshot.changeBody(state, changed: outcome.changed))
        case .notSaved(let reason):
            log?.log(.error, "\(reason); the change was refused, and the service is degraded until a write succeeds")
            return .error(
                503,
                ServiceError(
                    "state_not_saved",
                    "the token could not be saved to the state file and is not served; retry; see the service's log"))
        case .versionExhausted:
            log?.log(.error, "a change was refused: \(TokenState.versionExhausted)")
            return .error(503, ServiceError("store_unavailable", TokenState.versionExhausted))
        case .unknown, .unavailable:
            return .error(
                503, ServiceError("store_unavailable", "the token's store did not confirm the write; retry"),
                headers: ["Retry-After": "1"])
        case .stopping:
            // Connection: close, so that the client retries on another connection (another replica).
            return .error(
                503, ServiceError("shutting_down", "the service is stopping"),
                headers: ["Retry-After": String(retryAfterSeconds), "Connection": "close"])
        }
    }

    /// `/healthz` and `/readyz` (docs/operations.md, "Probes"): `503 draining` from the
    /// first signal of a drain on, `503 shutting_down` once stopping without one, else the
    /// store's health. Reads no lock of the owner's (`TokenOwner.health` and `isStopping` are
    /// kept apart from it) and never waits for the store.
    private func health() -> HTTPResponse {
        if isDraining { return Self.drainingHealth }
        if owner.isStopping { return Self.shuttingDown }
        if let replica { return replica.healthResponse(owner.health) }
        switch owner.health {
        case .ok: return Self.healthy
        case .degraded(let reason): return .json(200, encoding: ["status": "degraded", "reason": reason.rawValue])
        case .starting: return Self.starting
        }
    }

    private static let healthy = HTTPResponse.json(200, encoding: ["status": "ok"])
    /// `/livez`: the process answers; nothing else is asked.
    private static let alive = HTTPResponse.json(200, encoding: ["status": "ok"])
    /// `/healthz` and `/readyz` while draining.
    private static let drainingHealth = HTTPResponse.json(503, encoding: ["status": "draining"])
    private static let shuttingDown = HTTPResponse.json(503, encoding: ["status": "shutting_down"])
    /// The state is not known yet (a store that has not been read).
    private static let starting = HTTPResponse.json(503, encoding: ["status": "starting"])

    // MARK: Event streams

    /// An event stream's subscription: its `EventSubscriber`, and the handle the engine ends it
    /// with when its connection goes (`cancel()`) or its client leaves (`abort()`).
    public typealias StreamSubscription = TokenOwner<TokenSnapshot>.Subscription<EventSubscriber>

    /// Registers an event-stream subscriber whose first event is the current token.
    /// - Parameters:
    ///   - admitted: the `GET /token/stream` request (its `Last-Event-ID`).
    ///   - wake: resumes the subscriber's connection (see `EventSubscriber`).
    /// - Returns: the response head (200 with the SSE header fields) and the subscription (the
    ///   subscriber, and the handle its connection ends it with), or a 503
    ///   (`too_many_subscribers` with `Retry-After`, or `shutting_down`) and `nil`.
    public func openEventStream(
        for admitted: AdmittedRequest,
        wake: @escaping @Sendable () -> Void
    ) -> (HTTPResponse, StreamSubscription?) {
        var preamble: [UInt8] = []
        var floor: UInt64?
        let draining = isDraining
        if let replica {
            if case .starting = owner.health, !owner.isStopping {
                return (ReplicaMode.notReadYet, nil)
            }
            (preamble, floor) = replica.streamStart(
                lastEventID: admitted.request.headers["Last-Event-ID"], currentVersion: owner.version)
        } else if draining {
            // Its client is about to come back: tell it when, as a replica does.
            preamble = ReplicaMode.retryPreamble()
        }
        do {
            let grant = admitted.grant
            let subscription = try owner.subscribe { [deliveries] id, first in
                EventSubscriber(
                    id: id, first: first, tally: deliveries, preamble: preamble, floor: floor, credential: grant,
                    wake: wake)
            }
            if let grant, let credentials, !credentials.withThreadLock({ $0.admits(grant) }) {
                // Its token was revoked by a reload between the check and the subscription, after
                // that reload's sweep: the stream ends after its first event, as the sweep would.
                owner.finish(subscription.id, reason: .revoked)
            }
            if draining {
                // 200, its event and retry:, then the end (a 503 would make a browser's
                // EventSource give up for good; docs/operations.md, "Draining").
                _ = subscription.subscriber.end(.finish, reason: .drain)
            } else {
                ageLimits.withLock { limits in
                    guard limits.isEnabled else { return }
                    var generator = SystemRandomNumberGenerator()
                    limits.opened(subscription.id, at: .now, limit: limits.drawLimit(using: &generator))
                }
            }
            return (HTTPResponse(status: 200, headers: ServerSentEvents.responseHeaders), subscription)
        } catch .full {
            let error = ServiceError(
                "too_many_subscribers",
                "the service is at its limit of \(owner.maxSubscribers) subscribers; retry later")
            return (.error(503, error, headers: ["Retry-After": String(retryAfterSeconds)]), nil)
        } catch {
            return (
                .error(
                    503, ServiceError("shutting_down", "the service is stopping"),
                    headers: ["Retry-After": String(retryAfterSeconds)]), nil
            )
        }
    }

    // MARK: Credentials

    /// The token sets in force now; `nil` for a service without tokens.
    public var currentCredentials: BearerAuthentication? { credentials?.withThreadLock { $0 } }

    /// The policy in force (`currentCredentials`), for the fuzz harness and the tests.
    var authentication: BearerAuthentication? { currentCredentials }

    /// Puts `new` in force from the next request (a reload of the token files, docs/operations.md,
    /// "Rotating tokens") and ends cleanly every event stream whose token is in neither of `new`'s
    /// sets, under `StreamEndReason.revoked` (a stream admitted while this runs is checked again
    /// once subscribed, so none escapes). Call it from one thread at a time (`CredentialReloader`
    /// runs on one serial queue): two at once could end a stream whose token the later put back,
    /// or leave threads with different sets.
    /// - Parameter new: the policy built from the files just read; it must protect the same
    ///   routes as the one in force (the same files are read again).
    /// - Returns: how many streams were ended, or `nil` (nothing changed) when the service has no
    ///   tokens or `new` protects other routes.
    public func replaceCredentials(_ new: BearerAuthentication) -> Int? {
        guard let credentials else { return nil }
        // Every shard holds the same sets (one caller at a time changes them): read one, then
        // put the new sets in every shard before the sweep below, so that a stream subscribed
        // after the sweep is checked again against the new sets whichever thread it is on.
        let current = credentials.withThreadLock { $0 }
        guard new.scope == current.scope else { return nil }
        var next = new
        next.generation = current.generation &+ 1
        let revoked = current.allTokens.subtracting(next.allTokens)
        credentials.forEachShard { [next] in $0 = next }
        guard !revoked.isEmpty else { return 0 }
        return owner.finish(reason: .revoked) { subscriber in
            guard let token = (subscriber as? EventSubscriber)?.credential else { return false }
            return revoked.contains(token)
        }
    }

    // MARK: Draining and stream age

    /// Whether the service is draining (docs/operations.md, "Draining"): `/healthz` and
    /// `/readyz` answer `503 draining`, and a new event stream gets its event and `retry:` and
    /// then ends. Reads and writes are served as before.
    public var isDraining: Bool { draining.withLock { $0 } }

    /// The drain begins (`Service.shutdown(engine:)`, the first signal with `--drain-seconds`
    /// above 0): readiness turns off at once. It never turns back on: the process is leaving.
    public func beginDraining() {
        ageLimits.withLock { $0.stop() }  // from now on the drain alone ends streams
        draining.withLock { $0 = true }
    }

    /// Ends, cleanly, the streams that have reached their age limit by `now` (`--max-stream-age`;
    /// `StreamEndReason.age`), paced by `StreamAgeLimits.due(at:)` (at most
    /// `StreamAgeLimits.maxEndsPer100ms` in any 100 ms). The engine calls it every 50 ms; nothing
    /// happens while limits are off, or once a drain has begun (`beginDraining()`).
    public func endStreamsPastTheirAge(at now: ContinuousClock.Instant = .now) {
        for id in ageLimits.withLock({ $0.due(at: now) }) {
            owner.finish(id, reason: .age)
        }
    }

    /// Whether streams have age limits (`--max-stream-age` above 0), so that the engine calls
    /// `endStreamsPastTheirAge` only then.
    public var limitsStreamAge: Bool { ageLimits.withLock { $0.isEnabled } }

    /// An event stream's connection is gone: counts its end under its reason
    /// (`forge_push_token_streams_ended_total`; `client` when nothing asked it to end) and forgets
    /// its age limit. The engine calls it once per stream, when its response is freed.
    public func streamEnded(_ subscriber: EventSubscriber) {
        metrics.recordStreamEnded(subscriber.endReason ?? .client)
        ageLimits.withLock { $0.closed(subscriber.id) }
    }

    // MARK: Records

    /// Whether `recordFinished(_:)` logs the peer's address (the JSON access log's `remote`), so
    /// that the engine looks it up only then.
    public var logsPeerAddresses: Bool { accessLog && log?.format == .json }

    /// Counts `finished` in the metrics and, with `accessLog`, logs it (`ServerLog.access`).
    public func recordFinished(_ finished: FinishedRequest) {
        metrics.recordRequest(
            route: finished.route, method: finished.method, status: finished.status,
            seconds: finished.wasStream ? nil : finished.microseconds.map { Double($0) / 1e6 })
        guard accessLog, let log else { return }
        log.access(
            method: finished.method, path: finished.path, status: finished.status == 0 ? nil : finished.status,
            bytes: finished.bytes, durationMicros: Int64(finished.microseconds ?? 0), remote: finished.remote)
    }

}

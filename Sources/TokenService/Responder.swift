import ForgePushToken
import ForgePushTokenOwner
import HTTPServing
import ServerSupport

/// The HTTP API (docs/http-api.md, `openapi.yaml`) over the `TokenOwner`: the routes. An engine
/// serves it through `HTTPApplication` (Responder+HTTPApplication.swift), and nothing else.
///
/// Per request: `admit(_:)` once the head has arrived (`RouteAccess`: the route is matched and the
/// head checked there, once: 404, `OPTIONS`, 405, 401, 403), then `respond(to:body:)` with the
/// admitted request and its body, which answers at once, asks for an event stream
/// (`StreamGate.open(for:wake:)`), or answers later (a `PendingResponse`, for a write the store
/// decides on its own thread); at the end `recordFinished(_:label:)` (`RequestRecords`). The CORS header
/// fields are not added here: the engine adds them to every answer, its own included, where it
/// completes each answer's header (`ResponseHeaders.completing(_:crossOrigin:origin:)`, with
/// `traits.crossOrigin`).
///
/// Its jobs, each in a part of its own: who may call which route (`access`, a `RouteAccess`); the
/// handlers, the write outcomes and the probes (here); the `/metrics` page (Responder+Metrics.swift);
/// the event streams, the drain and the revoked tokens' sweep (`streams`, a `StreamGate`); the
/// records and the access log (`records`, `RequestRecords`).
///
/// Thread-safety: all members may be called from any thread, concurrently.
public final class Responder: Sendable {
    /// What to send for one admitted request (`HTTPReply`).
    public typealias Reply = HTTPReply
    /// What the head of a request decided (`HTTPAdmission`), labelled with its route (`nil` for
    /// an unknown path).
    public typealias Admission = HTTPAdmission<AdmittedRequest, Route?>

    /// The one owner of the token and its subscribers. No engine sees it: an engine asks this
    /// responder (`HTTPApplication`), which asks the owner; `Service` drives its shutdown.
    public let owner: TokenOwner<TokenSnapshot>
    /// The service's counters, served at `GET /metrics`.
    public let metrics = ServiceMetrics()
    /// Events sent to and skipped by every subscriber, past and present.
    public let deliveries = DeliveryTally()
    /// Who may call which route, and the token sets in force.
    public let access: RouteAccess
    /// The event streams: opening them, the drain, the age limits, the revoked tokens' sweep.
    public let streams: StreamGate
    /// The records of finished requests (the metrics, the access log).
    public let records: RequestRecords
    /// Where failures are logged.
    let log: ServerLog?
    /// The replica mode (docs/replicas.md), or `nil` for a service that runs alone.
    let replica: ReplicaMode?

    /// Creates the responder over `owner`.
    /// - Parameters:
    ///   - authentication: the bearer token and its scope, or `nil` for an open service.
    ///   - crossOrigin: the origins allowed to read responses from a browser (default none).
    ///   - log: where failures, registration failures and the access log go (default: nowhere).
    ///   - accessLog: whether to log one line per finished request.
    ///   - replica: the replica mode, when the token is shared with other replicas (default none).
    ///   - maxStreamAge: `--max-stream-age` in seconds: 0 (off, the default), or 60 to 86,400
    ///     (`StreamAgeLimits.range`); each stream draws its own limit from [A/2, A].
    ///   - clock: when streams open and reach their age (`ServerClock`; default `.monotonic`).
    public init(
        owner: TokenOwner<TokenSnapshot>, authentication: BearerAuthentication? = nil,
        crossOrigin: CrossOriginPolicy = CrossOriginPolicy(), log: ServerLog? = nil, accessLog: Bool = false,
        replica: ReplicaMode? = nil, maxStreamAge: Int = 0, clock: ServerClock = .monotonic
    ) {
        self.owner = owner
        self.replica = replica
        self.log = log
        let access = RouteAccess(authentication: authentication, crossOrigin: crossOrigin, metrics: metrics)
        self.access = access
        self.streams = StreamGate(
            owner: owner, deliveries: deliveries, replica: replica, access: access, metrics: metrics,
            maxStreamAge: maxStreamAge, clock: clock)
        self.records = RequestRecords(metrics: metrics, log: log, accessLog: accessLog)
    }

    // MARK: Requests

    /// `RouteAccess.admit(_:)`: what a request's head alone decides, before its body is read.
    public func admit(_ head: consuming HTTPRequest) -> Admission {
        access.admit(head)
    }

    /// The reply to an admitted request with its whole `body` (`HTTPApplication.respond(to:body:)`).
    /// Never throws: every failure is an error response.
    public func respond(to admitted: AdmittedRequest, body: [UInt8]) -> Reply {
        let request = admitted.request
        switch admitted.route {
        case .register:
            do {
                let token = try RequestBodies.deviceTokenHex(
                    contentType: request.headers["Content-Type"], body: body)
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
                    body: body)
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
            return .response(metricsPage())
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
                headers: ["Retry-After": String(StreamGate.retryAfterSeconds), "Connection": "close"])
        }
    }

    /// `/healthz` and `/readyz` (docs/operations.md, "Probes"): `503 draining` from the
    /// first signal of a drain on, `503 shutting_down` once stopping without one, else the
    /// store's health. Reads no lock of the owner's (`TokenOwner.health` and `isStopping` are
    /// kept apart from it) and never waits for the store.
    private func health() -> HTTPResponse {
        if streams.isDraining { return Self.drainingHealth }
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

    // MARK: Credentials

    /// Puts `new` in force from the next request (a reload of the token files, docs/operations.md,
    /// "Rotating tokens": `RouteAccess.replace(_:)`) and ends cleanly every event stream whose
    /// token is in neither of `new`'s sets, under `StreamEndReason.revoked` (`StreamGate.revoke`;
    /// a stream admitted while this runs is checked again once subscribed, so none escapes). Call
    /// it from one thread at a time (`CredentialReloader` runs on one serial queue): two at once
    /// could end a stream whose token the later put back, or leave threads with different sets.
    /// - Parameter new: the policy built from the files just read; it must protect the same
    ///   routes as the one in force (the same files are read again).
    /// - Returns: how many streams were ended, or `nil` (nothing changed) when the service has no
    ///   tokens or `new` protects other routes.
    public func replaceCredentials(_ new: BearerAuthentication) -> Int? {
        guard let revoked = access.replace(new) else { return nil }
        guard !revoked.isEmpty else { return 0 }
        return streams.revoke(revoked)
    }
}

import ForgePushToken
import ForgePushTokenOwner
import HTTPServing
import ServerSupport

/// The event streams' side of the responder: opening a stream (the replica's start, the drain, the
/// age limit, the token's recheck), the drain flag, the age limits, counting each stream's end,
/// and ending the streams whose token was revoked. One of the responder's jobs, apart from the
/// handlers.
///
/// Each open stream's age limit and the token that admitted it are kept here, by subscriber id
/// (`OpenStreams`), so that a revocation finds its streams by id, without asking the owner's
/// subscribers what they are.
///
/// Thread-safety: all members may be called from any thread, concurrently.
public final class StreamGate: Sendable {
    /// An event stream's subscription: its `EventSubscriber`, and the handle the engine ends it
    /// with when its connection goes (`cancel()`) or its client leaves (`abort()`).
    public typealias Subscription = TokenOwner<TokenSnapshot>.Subscription<EventSubscriber>

    /// What is kept of the open streams, behind one lock (`StreamGate.streams`).
    struct OpenStreams: Sendable {
        /// Each open stream's age limit (`--max-stream-age`).
        var ageLimits: StreamAgeLimits
        /// The token that admitted each open stream that needed one, by subscriber id.
        var tokens: [UInt64: [UInt8]] = [:]
    }

    /// Seconds a refused subscriber is told to wait (`Retry-After`).
    public static let retryAfterSeconds = 5

    private let owner: TokenOwner<TokenSnapshot>
    private let deliveries: DeliveryTally
    private let replica: ReplicaMode?
    private let access: RouteAccess
    private let metrics: ServiceMetrics
    /// Whether the service is draining (`beginDraining()`): its own lock, so that probes never
    /// take the owner's.
    private let draining = Locked(false)
    /// The open streams' age limits and tokens.
    private let streams: Locked<OpenStreams>
    /// When a stream opened and when its age limit has passed (`Service.Settings.clock`).
    private let clock: ServerClock

    init(
        owner: TokenOwner<TokenSnapshot>, deliveries: DeliveryTally, replica: ReplicaMode?, access: RouteAccess,
        metrics: ServiceMetrics, maxStreamAge: Int, clock: ServerClock
    ) {
        self.owner = owner
        self.clock = clock
        self.deliveries = deliveries
        self.replica = replica
        self.access = access
        self.metrics = metrics
        self.streams = Locked(OpenStreams(ageLimits: StreamAgeLimits(seconds: maxStreamAge)))
    }

    /// Registers an event-stream subscriber whose first event is the current token.
    /// - Parameters:
    ///   - admitted: the `GET /token/stream` request (its `Last-Event-ID`, its grant).
    ///   - wake: resumes the subscriber's connection (see `EventSubscriber`).
    /// - Returns: the response head (200 with the SSE header fields) and the subscription (the
    ///   subscriber, and the handle its connection ends it with), or a 503
    ///   (`too_many_subscribers` with `Retry-After`, or `shutting_down`) and `nil`.
    public func open(for admitted: AdmittedRequest, wake: @escaping @Sendable () -> Void) -> (
        HTTPResponse, Subscription?
    ) {
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
            let id = subscription.id
            streams.withLock { streams in
                if let grant { streams.tokens[id] = grant.token }
                guard !draining, streams.ageLimits.isEnabled else { return }
                var generator = SystemRandomNumberGenerator()
                streams.ageLimits.opened(id, at: clock.now, limit: streams.ageLimits.drawLimit(using: &generator))
            }
            if let grant, !access.admits(grant) {
                // Its token was revoked by a reload between the check and the subscription, after
                // that reload's sweep: the stream ends after its first event, as the sweep would.
                owner.finish(id, reason: .revoked)
            }
            if draining {
                // 200, its event and retry:, then the end (a 503 would make a browser's
                // EventSource give up for good; docs/operations.md, "Draining").
                _ = subscription.subscriber.end(.finish, reason: .drain)
            }
            return (HTTPResponse(status: 200, headers: ServerSentEvents.responseHeaders), subscription)
        } catch .full {
            let error = ServiceError(
                "too_many_subscribers",
                "the service is at its limit of \(owner.maxSubscribers) subscribers; retry later")
            return (.error(503, error, headers: ["Retry-After": String(Self.retryAfterSeconds)]), nil)
        } catch {
            return (
                .error(
                    503, ServiceError("shutting_down", "the service is stopping"),
                    headers: ["Retry-After": String(Self.retryAfterSeconds)]), nil
            )
        }
    }

    /// An event stream's connection is gone: counts its end under its reason
    /// (`forge_push_token_streams_ended_total`; `client` when nothing asked it to end) and forgets
    /// its age limit and token. The engine calls it once per stream, when its response is freed.
    public func ended(_ subscriber: EventSubscriber) {
        metrics.recordStreamEnded(subscriber.endReason ?? .client)
        streams.withLock { streams in
            streams.ageLimits.closed(subscriber.id)
            streams.tokens[subscriber.id] = nil
        }
    }

    /// Ends cleanly, under `StreamEndReason.revoked`, every open stream admitted by one of
    /// `tokens` (`Responder.replaceCredentials(_:)`, after the new sets are in force).
    /// - Returns: how many streams were ended.
    func revoke(_ tokens: Set<[UInt8]>) -> Int {
        let ids = streams.withLock { streams in streams.tokens.filter { tokens.contains($0.value) }.map(\.key) }
        for id in ids { owner.finish(id, reason: .revoked) }
        return ids.count
    }

    /// Whether the service is draining (docs/operations.md, "Draining"): `/healthz` and
    /// `/readyz` answer `503 draining`, and a new event stream gets its event and `retry:` and
    /// then ends. Reads and writes are served as before.
    public var isDraining: Bool { draining.withLock { $0 } }

    /// The drain begins (`Service.shutdown(engine:)`, the first signal with `--drain-seconds`
    /// above 0): readiness turns off at once. It never turns back on: the process is leaving.
    public func beginDraining() {
        streams.withLock { $0.ageLimits.stop() }  // from now on the drain alone ends streams
        draining.withLock { $0 = true }
    }

    /// Ends, cleanly, the streams that have reached their age limit by now on the service's clock
    /// (`--max-stream-age`;
    /// `StreamEndReason.age`), paced by `StreamAgeLimits.due(at:)` (at most
    /// `StreamAgeLimits.maxEndsPer100ms` in any 100 ms). The engine's tick calls it every 50 ms;
    /// nothing happens while limits are off, or once a drain has begun (`beginDraining()`).
    public func endStreamsPastTheirAge() {
        let now = clock.now
        for id in streams.withLock({ $0.ageLimits.due(at: now) }) {
            owner.finish(id, reason: .age)
        }
    }

    /// Whether streams have age limits (`--max-stream-age` above 0): the engine ticks only then.
    public var limitsStreamAge: Bool { streams.withLock { $0.ageLimits.isEnabled } }
}

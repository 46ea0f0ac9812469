import ForgePushToken
import ForgePushTokenOwner

// The service as an engine sees it: `Responder` as an `HTTPApplication`. The routes live in
// Responder.swift; this file is only what an engine asks besides them (the cached read, the
// heartbeat, the records) and the event stream it reads.

extension Responder: HTTPApplication {
    /// What the routes read: the body's type, the bearer token, CORS, the conditional read, the
    /// stream's resumption.
    public var headerFieldsRead: [String] { Self.headerFields }

    /// `access_token`, the bearer token's query form (RFC 6750 §2.3): no other parameter matters.
    public var queryParametersRead: [String] { Self.queryParameters }

    private static let headerFields = [
        "Content-Type", "Authorization", "Origin", "Access-Control-Request-Method", "If-None-Match",
        "Last-Event-ID",
    ]
    private static let queryParameters = ["access_token"]

    /// `GET /token` (and `HEAD`) is the cached read.
    public var cachedReadPath: StaticString { "/token" }

    /// `answersTokenReadsBlindly`.
    public var answersCachedReadsBlindly: Bool { answersTokenReadsBlindly }

    /// The owner's version (`TokenOwner.version`: one uncontended lock, nothing copied).
    public var cachedReadVersion: UInt64 { owner.version }

    /// The current token's `GET /token` answers: the 200 and its `304 Not Modified`, rendered
    /// once per version by `TokenSnapshot`.
    public func cachedRead() -> CachedRead {
        let snapshot = owner.current
        return CachedRead(
            version: snapshot.version, response: Self.tokenResponse(snapshot),
            notModified: Self.tokenNotModified(snapshot), entityTag: snapshot.entityTag)
    }

    /// `openEventStream(for:wake:)`, its subscription wrapped for the engine.
    public func openStream(for admitted: AdmittedRequest, wake: @escaping @Sendable () -> Void) -> (
        HTTPResponse, ServiceEventStream?
    ) {
        let (head, subscription) = openEventStream(for: admitted, wake: wake)
        return (head, subscription.map { ServiceEventStream(subscription: $0, responder: self) })
    }

    /// `TokenOwner.heartbeat()`.
    public func heartbeat() {
        owner.heartbeat()
    }

    /// `limitsStreamAge`.
    public var wantsTicks: Bool { limitsStreamAge }

    /// `endStreamsPastTheirAge(at:)` now.
    public func tick() {
        endStreamsPastTheirAge()
    }

    /// `TokenOwner.abort(_:)`: the stream ends at once, counted under `client`.
    public func clientLeft(stream id: UInt64) {
        owner.abort(id)
    }

    /// `accessLog`.
    public var recordsEveryRequest: Bool { accessLog }

    /// `logsPeerAddresses`.
    public var wantsPeerAddresses: Bool { logsPeerAddresses }

    /// Counts `event` in the metrics (`forge_push_token_connections_refused_total`,
    /// `forge_push_token_request_timeouts_total`).
    public func record(_ event: EngineEvent) {
        switch event {
        case .connectionRefusedTotalLimit: metrics.increment(.connectionsRefusedTotalLimit)
        case .connectionRefusedPerAddressLimit: metrics.increment(.connectionsRefusedPerAddressLimit)
        case .requestTimedOut(let body): metrics.increment(body ? .requestTimeoutsBody : .requestTimeoutsHead)
        }
    }
}

/// One `GET /token/stream` as the engine reads it: the subscription (the `EventSubscriber` and
/// the handle that ends it with the owner) and the responder that counts its end.
///
/// A value type; `Sendable`. Made by `Responder.openStream(for:wake:)`.
public struct ServiceEventStream: HTTPEventSource {
    /// The subscription, as `TokenOwner.subscribe` returned it.
    public let subscription: Responder.StreamSubscription
    let responder: Responder

    /// The subscriber's id within the owner.
    public var id: UInt64 { subscription.id }

    /// The subscriber (its read, its end reason).
    public var subscriber: EventSubscriber { subscription.subscriber }

    /// `EventSubscriber.read(into:suspend:)`.
    public func read(into buffer: UnsafeMutableRawBufferPointer, suspend: () -> Void) -> EventStreamRead {
        subscription.subscriber.read(into: buffer, suspend: suspend)
    }

    /// The owner forgets the subscriber (`Subscription.cancel()`), and the responder counts the
    /// stream's end under its reason (`Responder.streamEnded`).
    public func close() {
        subscription.cancel()
        responder.streamEnded(subscription.subscriber)
    }
}

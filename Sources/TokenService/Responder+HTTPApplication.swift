import ForgePushToken
import ForgePushTokenOwner
import HTTPServing
import ServerSupport

// The service as an engine sees it: `Responder` as an `HTTPApplication`. The routes live in
// Responder.swift; this file is only what an engine asks besides them (the cached read, the
// heartbeat, the records) and the event stream it reads.

extension Responder: HTTPApplication, HTTPCachedReads, HTTPTicks {
    /// What the engine reads once, at start: CORS; the header fields the routes read (the body's
    /// type, the bearer token, CORS, the conditional read, the stream's resumption) and the one
    /// query parameter, `access_token` (the bearer token's query form, RFC 6750 §2.3); the access
    /// log; `GET /token` as the cached read; the stream age limits' ticks.
    public var traits: HTTPApplicationTraits {
        HTTPApplicationTraits(
            crossOrigin: access.crossOrigin,
            headerFieldsRead: [
                "Content-Type", "Authorization", "Origin", "Access-Control-Request-Method", "If-None-Match",
                "Last-Event-ID",
            ],
            queryParametersRead: ["access_token"], recordsEveryRequest: records.accessLog,
            wantsPeerAddresses: records.logsPeerAddresses, cachedReadPath: "/token", wantsTicks: streams.limitsStreamAge
        )
    }

    /// Whether `GET /token` may be answered without looking at the request's header fields: no
    /// token protects it and no CORS header field depends on its `Origin`
    /// (`RouteAccess.answersReadsBlindly`), and, for a replica, its store is healthy (else the
    /// answer carries the replica's staleness fields). The engine's allocation-free path for that
    /// request is only taken when this holds (it reads `If-None-Match` itself, in place, for the
    /// 304).
    public var answersCachedReadsBlindly: Bool {
        access.answersReadsBlindly && (replica == nil || owner.health == .ok)
    }

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

    /// `StreamGate.open(for:wake:)`, its subscription wrapped for the engine.
    public func openStream(for admitted: AdmittedRequest, wake: @escaping @Sendable () -> Void) -> (
        HTTPResponse, ServiceEventStream?
    ) {
        let (head, subscription) = streams.open(for: admitted, wake: wake)
        return (head, subscription.map { ServiceEventStream(subscription: $0, streams: streams) })
    }

    /// `TokenOwner.heartbeat()`.
    public func heartbeat() {
        owner.heartbeat()
    }

    /// `StreamGate.endStreamsPastTheirAge()`.
    public func tick() {
        streams.endStreamsPastTheirAge()
    }

    /// `TokenOwner.abort(_:)`: the stream ends at once, counted under `client`.
    public func clientLeft(stream id: UInt64) {
        owner.abort(id)
    }

    /// `RequestRecords.finished(_:label:)`.
    public func recordFinished(_ finished: FinishedRequest, label: Route?) {
        records.finished(finished, label: label)
    }

    /// `RequestRecords.engine(_:)`.
    public func record(_ event: EngineEvent) {
        records.engine(event)
    }
}

/// A request whose head passed `Responder.admit(_:)`: its route, matched once, and the token that
/// admitted it (the service's `HTTPApplication.Admitted`).
///
/// A value type; `Sendable`.
public struct AdmittedRequest: Sendable {
    /// The route of the request's path.
    public let route: Route
    /// The request (its body comes apart, to `Responder.respond(to:body:)`).
    public var request: HTTPRequest
    /// The token that admitted the request, or `nil` when the route needed none.
    public var grant: BearerAuthentication.Grant?

    /// An admitted request for `route`, admitted by `grant` (`nil`: no token needed).
    public init(route: Route, request: HTTPRequest, grant: BearerAuthentication.Grant? = nil) {
        self.route = route
        self.request = request
        self.grant = grant
    }
}

/// One `GET /token/stream` as the engine reads it: the subscription (the `EventSubscriber` and
/// the handle that ends it with the owner) and the stream gate that counts its end.
///
/// A value type; `Sendable`. Made by `Responder.openStream(for:wake:)`.
public struct ServiceEventStream: HTTPEventSource {
    /// The subscription, as `TokenOwner.subscribe` returned it.
    public let subscription: StreamGate.Subscription
    let streams: StreamGate

    /// The subscriber's id within the owner.
    public var id: UInt64 { subscription.id }

    /// The subscriber (its read, its end reason).
    public var subscriber: EventSubscriber { subscription.subscriber }

    /// `EventSubscriber.read(into:suspend:)`.
    public func read(into buffer: UnsafeMutableRawBufferPointer, suspend: () -> Void) -> EventStreamRead {
        subscription.subscriber.read(into: buffer, suspend: suspend)
    }

    /// The owner forgets the subscriber (`Subscription.cancel()`), and the stream gate counts the
    /// stream's end under its reason (`StreamGate.ended(_:)`).
    public func close() {
        subscription.cancel()
        streams.ended(subscription.subscriber)
    }
}

import CMicroHTTPD
import ForgePushToken
import HTTPServing

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// Per-request state, owned by libmicrohttpd's `*con_cls` from the first access-handler call until
/// the request-completed callback. Only the connection's polling thread touches it. Where the
/// request stands is one value, `machine` (`RequestStateMachine`); the rest is what the engine
/// keeps beside it (the body's bytes, what was sent, for the metrics and the access log). A
/// request the application was asked about is one of two subclasses, which add what is the
/// application's own: its label (`LabelledRequestContext`), and its admitted request
/// (`AdmittedRequestContext`); `kind` says which, so that no dynamic cast is needed. The engine's
/// code is not specialised for its application, so none of this is a type generic over the
/// application's types but these two classes, made from metatypes kept by the daemon (no generic
/// metadata is looked up per request: docs/performance.md).
///
/// Its variables are `@exclusivity(unchecked)` (SE-0176's per-declaration opt-out of the run-time
/// exclusivity check, which cost about 550 instructions a `POST /register`): sound because one
/// thread touches them, and no access to one of them is held across a call that touches the same
/// one (the engine reads or sets each in one statement; `machine`'s mutating steps and `body`'s
/// appends call nothing that reaches this context).
class RequestContext {
    /// Which class a context is.
    enum Kind {
        /// The engine refused the request on its own: no label.
        case engine
        /// A `LabelledRequestContext`: the application answered the head.
        case labelled
        /// An `AdmittedRequestContext`: the application admitted the request.
        case admitted
    }

    let kind: Kind
    let method: String
    let path: String
    /// When the head was admitted (`ServerConfiguration.clock`): its record's duration runs from here.
    let started: ContinuousClock.Instant
    /// Where the request stands, and the body bytes received.
    @exclusivity(unchecked) var machine: RequestStateMachine
    /// The body bytes kept (`RequestStateMachine.BodyVerdict.keep`).
    @exclusivity(unchecked) var body: [UInt8] = []
    /// Whether the body comes chunked (its connection has a short idle timeout until it is complete).
    let chunked: Bool
    @exclusivity(unchecked) var status = 0
    @exclusivity(unchecked) var bytes = 0
    /// The pending answer its suspended connection waits for, while it is in the server's
    /// `ParkedResponses` (`Daemon.answer`).
    @exclusivity(unchecked) var parked: PendingResponse?
    /// The event stream opened for it, if any.
    @exclusivity(unchecked) var stream: StreamResponse?
    /// Whether its event stream was handed over (`DetachedStream`, which records it when it ends).
    @exclusivity(unchecked) var detached = false
    /// The request's `Origin` field value, kept from its head on so that every answer to it, the
    /// engine's own included, gets the same CORS fields (`ResponseHeaders.completing`).
    let origin: String?
    /// The application's CORS policy (`HTTPApplicationTraits.crossOrigin`).
    let crossOrigin: CrossOriginPolicy
    /// What the head costs in libmicrohttpd's pool (`RequestHeadBudget`): its bytes, its records
    /// (fields, query arguments, cookies) and its first `Cookie` value's length; what a chunked
    /// body's trailer fields add to it is checked against the same budget (`trailerRefusal`).
    @exclusivity(unchecked) var headCost = (bytes: 0, records: 0, cookieValueBytes: Int?.none)
    /// Whether the trailer fields were checked (once, in the call where the body is complete).
    @exclusivity(unchecked) var trailerChecked = false

    init(
        kind: Kind = .engine, method: String, path: String, chunked: Bool, origin: String?,
        crossOrigin: CrossOriginPolicy, limit: Int, started: ContinuousClock.Instant
    ) {
        self.kind = kind
        self.started = started
        self.machine = RequestStateMachine(limit: limit)
        self.method = method
        self.path = path
        self.chunked = chunked
        self.origin = origin
        self.crossOrigin = crossOrigin
    }
}

/// A request whose head the application answered (`HTTPAdmission.answer`): its label, for its
/// record.
final class LabelledRequestContext<Label: HTTPRequestLabel & Sendable>: RequestContext {
    /// The label `HTTPApplication.admit` gave the request.
    let label: Label

    init(
        label: Label, method: String, path: String, chunked: Bool, origin: String?, crossOrigin: CrossOriginPolicy,
        limit: Int, started: ContinuousClock.Instant
    ) {
        self.label = label
        super.init(
            kind: .labelled, method: method, path: path, chunked: chunked, origin: origin, crossOrigin: crossOrigin,
            limit: limit, started: started)
    }
}

/// A request the application admitted (`HTTPAdmission.proceed`): its admitted request, kept until
/// `HTTPApplication.respond(to:body:)` and `openStream(for:wake:)`, and its label.
final class AdmittedRequestContext<Admitted: Sendable, Label: HTTPRequestLabel & Sendable>: RequestContext {
    /// The request as the application admitted it.
    let admitted: Admitted
    /// The label `HTTPApplication.admit` gave the request.
    let label: Label

    init(
        admitted: Admitted, label: Label, method: String, path: String, chunked: Bool, origin: String?,
        crossOrigin: CrossOriginPolicy, limit: Int, started: ContinuousClock.Instant
    ) {
        self.admitted = admitted
        self.label = label
        super.init(
            kind: .admitted, method: method, path: path, chunked: chunked, origin: origin, crossOrigin: crossOrigin,
            limit: limit, started: started)
    }
}

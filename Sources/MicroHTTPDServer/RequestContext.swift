import CMicroHTTPD
import ForgePushToken
import ForgePushTokenHTTP

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// Per-request state, owned by libmicrohttpd's `*con_cls` from the first access-handler call until
/// the request-completed callback. Only the connection's polling thread touches it. Where the
/// request stands is one value, `machine` (`RequestStateMachine`); the rest is what the engine
/// keeps beside it (the body's bytes, what was sent, for the metrics and the access log).
///
/// Its variables are `@exclusivity(unchecked)` (SE-0176's per-declaration opt-out of the run-time
/// exclusivity check, which cost about 550 instructions a `POST /register`): sound because one
/// thread touches them, and no access to one of them is held across a call that touches the same
/// one (the engine reads or sets each in one statement; `machine`'s mutating steps and `body`'s
/// appends call nothing that reaches this context).
final class RequestContext {
    let method: String
    let path: String
    let started = ContinuousClock.now
    /// Where the request stands, and the body bytes received.
    @exclusivity(unchecked) var machine: RequestStateMachine
    /// The route `HTTPApplication.admit` matched (kept for the metrics once the request is over).
    @exclusivity(unchecked) var route: Route?
    /// The body bytes kept (`RequestStateMachine.Action.keep`).
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
    /// The service's CORS policy (`HTTPApplication.crossOrigin`).
    let crossOrigin: CrossOriginPolicy
    /// What the head costs in libmicrohttpd's pool (`RequestHeadBudget`): its bytes, its records
    /// (fields, query arguments, cookies) and its first `Cookie` value's length; what a chunked
    /// body's trailer fields add to it is checked against the same budget (`trailerRefusal`).
    @exclusivity(unchecked) var headCost = (bytes: 0, records: 0, cookieValueBytes: Int?.none)
    /// Whether the trailer fields were checked (once, in the call where the body is complete).
    @exclusivity(unchecked) var trailerChecked = false

    /// Microseconds since the request was opened (for its record).
    var elapsedMicroseconds: Int { microseconds(since: started) }

    init(
        method: String, path: String, chunked: Bool, origin: String?, crossOrigin: CrossOriginPolicy, limit: Int
    ) {
        self.machine = RequestStateMachine(limit: limit)
        self.method = method
        self.path = path
        self.chunked = chunked
        self.origin = origin
        self.crossOrigin = crossOrigin
    }
}

/// Whole microseconds from `start` to now.
func microseconds(since start: ContinuousClock.Instant) -> Int {
    // `components` once: each reading divides the duration's 128-bit count.
    let elapsed = (ContinuousClock.now - start).components
    return Int(elapsed.seconds) * 1_000_000 + Int(elapsed.attoseconds / 1_000_000_000_000)
}

import CMicroHTTPD
import ForgePushToken
import ForgePushTokenHTTP

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// Per-request state, owned by libmicrohttpd's `*con_cls` from the first access-handler call until
/// the request-completed callback. Only the connection's polling thread touches it.
final class RequestContext {
    /// Where the request stands: one state instead of a set of flags.
    enum Progress {
        /// Its head passed the responder's checks: the body (if any) is being read.
        case admitted(Responder.AdmittedRequest)
        /// Its head alone decided this answer (404, 405, 401, 414, `OPTIONS`, a framing
        /// refusal): sent once the body (if any) has been read and dropped, or at once.
        case refused(HTTPResponse)
        /// Its body is over the limit: read and dropped, answered 413 at its end.
        case tooLarge
        /// `GET` or `HEAD /token`: answered from the `TokenResponseCache`.
        case tokenRead
        /// A write whose answer is decided later: the connection is suspended until it is.
        case waiting(PendingResponse)
        /// A response is queued (or a stream opened).
        case answered
    }

    let method: String
    let path: String
    let started = ContinuousClock.now
    var progress: Progress = .answered
    /// The route `Responder.admit` matched (kept for the metrics once the request is over).
    var route: Route?
    var body: [UInt8] = []
    /// Body bytes received so far, kept or not.
    var received = 0
    /// Whether the body comes chunked (its connection has a short idle timeout until it is complete).
    let chunked: Bool
    var status = 0
    var bytes = 0
    var stream: EventStream?
    /// The request's `Origin` field value, kept from its head on so that every answer to it, the
    /// engine's own included, gets the same CORS fields (`ResponseHeaders.completing`).
    let origin: String?
    /// The service's CORS policy (`Responder.crossOrigin`).
    let crossOrigin: CrossOriginPolicy

    init(method: String, path: String, chunked: Bool, origin: String?, crossOrigin: CrossOriginPolicy) {
        self.method = method
        self.path = path
        self.chunked = chunked
        self.origin = origin
        self.crossOrigin = crossOrigin
    }
}

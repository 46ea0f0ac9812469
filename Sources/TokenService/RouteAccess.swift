import ForgePushToken
import HTTPServing
import ServerSupport

/// Who may call which route: the responder's admission of a request's head (404, `OPTIONS`, 405,
/// 401, 403) and the token sets in force (`--auth-token`, the token files; docs/operations.md,
/// "Read and write tokens"). One of the responder's jobs, apart from the handlers.
///
/// Thread-safety: all members may be called from any thread, concurrently; `replace(_:)` from one
/// thread at a time (`Responder.replaceCredentials(_:)` says why).
public final class RouteAccess: Sendable {
    /// The token sets in force; `nil` when the service runs without a token. Replaced as a whole
    /// by `replace(_:)`; which routes need a token (`scope`) never changes. Kept per thread
    /// (`PerThreadLocked`, the same value in every shard), so that the writes' check takes no
    /// lock another request thread takes.
    let credentials: PerThreadLocked<BearerAuthentication>?
    /// Whether the reads need a token (scope `all`, or a read-token file): fixed at start.
    let readsNeedToken: Bool
    /// Which other origins' browser pages may read the responses (the `OPTIONS` answers here; the
    /// engine adds the CORS fields to every answer).
    public let crossOrigin: CrossOriginPolicy
    /// Where refusals are counted.
    private let metrics: ServiceMetrics

    /// Access under `authentication` (`nil`: an open service) and `crossOrigin`, counting
    /// refusals in `metrics`.
    init(authentication: BearerAuthentication?, crossOrigin: CrossOriginPolicy, metrics: ServiceMetrics) {
        self.credentials = authentication.map { authentication in PerThreadLocked { authentication } }
        self.readsNeedToken = authentication?.protects(.token) == true
        self.crossOrigin = crossOrigin
        self.metrics = metrics
    }

    /// Whether a read may be answered without looking at the request's header fields: no token
    /// protects it and no CORS header field depends on its `Origin`.
    var answersReadsBlindly: Bool { !readsNeedToken && !crossOrigin.isEnabled }

    /// Decides what a request's head (method, target, header fields) alone decides, before its
    /// body is read: 404 for an unknown path, the answer to `OPTIONS`, 405 for a method the path
    /// does not take, 401 when the route needs a bearer token and the request has none of the
    /// service's, 403 `insufficient_scope` for a write sent with a read token. Each answer and
    /// each admitted request is labelled with its route (`nil` for an unknown path).
    func admit(_ head: consuming HTTPRequest) -> HTTPAdmission<AdmittedRequest, Route?> {
        guard let route = Route(path: head.path) else {
            return .answer(.error(404, ServiceError("not_found", "no route for \(head.path)")), label: nil)
        }
        let method = head.method
        if method == "OPTIONS" {
            return .answer(crossOrigin.options(allowing: route.allowedMethods, request: head), label: route)
        }
        guard route.allowedMethods.contains(method) else {
            let allow = route.allowedMethods.joined(separator: ", ")
            return .answer(
                .error(
                    405, ServiceError("method_not_allowed", "\(route.rawValue) accepts \(allow)"),
                    headers: ["Allow": allow]), label: route)
        }
        guard let credentials, route.access == .write || (route.access == .read && readsNeedToken) else {
            return .proceed(AdmittedRequest(route: route, request: head), label: route)
        }
        let outcome = credentials.withThreadLock { $0 }.check(
            authorization: head.headers["Authorization"], query: head.query, method: method)
        guard case .authorized(let grant) = outcome else {
            metrics.increment(.unauthorizedRequests)
            return .answer(BearerAuthentication.unauthorized(outcome, method: method), label: route)
        }
        if route.access == .write && grant.role != .write {
            metrics.increment(.forbiddenRequests)
            return .answer(BearerAuthentication.insufficientScope, label: route)
        }
        return .proceed(AdmittedRequest(route: route, request: head, grant: grant), label: route)
    }

    /// The token sets in force now; `nil` for a service without tokens.
    public var current: BearerAuthentication? { credentials?.withThreadLock { $0 } }

    /// Whether `grant` is still good under the sets in force (always, without tokens).
    func admits(_ grant: BearerAuthentication.Grant) -> Bool {
        credentials?.withThreadLock { $0.admits(grant) } ?? true
    }

    /// Puts `new` in force in every thread's shard, from the next request.
    /// - Returns: the tokens in force before and in neither of `new`'s sets, or `nil` (nothing
    ///   changed) when the service has no tokens or `new` protects other routes.
    func replace(_ new: BearerAuthentication) -> Set<[UInt8]>? {
        guard let credentials else { return nil }
        // Every shard holds the same sets (one caller at a time changes them): read one, then put
        // the new sets in every shard, so that a stream subscribed after the caller's sweep is
        // checked again against the new sets whichever thread it is on.
        let current = credentials.withThreadLock { $0 }
        guard new.scope == current.scope else { return nil }
        var next = new
        next.generation = current.generation &+ 1
        credentials.forEachShard { [next] in $0 = next }
        return current.allTokens.subtracting(next.allTokens)
    }
}

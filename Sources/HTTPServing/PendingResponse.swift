import ForgePushToken
import ServerSupport

/// A response that is decided after the request's handler has returned: the answer to a write
/// whose commit is still in flight (a store that answers on its own thread).
///
/// One side (the commit's completion) calls `fulfil` once; the engine takes the response with
/// `takeIfReady()` at once, or with `take(orPark:resume:)`, which parks the request (the engine
/// suspends its connection, *under this object's lock*, so the suspension happens before any
/// `fulfil` can see it) and arranges for `resume` to be called once, outside the lock, when the
/// response arrives. The engine then calls `take(orPark:resume:)` again and gets it.
///
/// A stopping engine never leaves one parked: before libmicrohttpd stops (which it must not do
/// with a suspended connection), the engine calls `abandon()` on every response still parked,
/// which decides it as `abandonedAnswer` (a write whose store has not answered: hung Redis, a save
/// slower than the grace period), so that every request gets an answer
/// (docs/operations.md, "Draining").
///
/// Thread-safety: all members may be called from any thread.
public final class PendingResponse: Sendable {
    enum State: Sendable {
        case waiting
        case parked(resume: @Sendable () -> Void)
        case ready(HTTPResponse)
        case taken
    }

    /// `Locked`, not `Synchronization.Mutex`: the completion (a store's thread) and the engine's
    /// `take(orPark:resume:)` contend for it, and a contended `Mutex` is reported as a race by
    /// Thread Sanitizer on Linux (Sources/ForgePushToken/Locked.swift says why).
    private let state = Locked(State.waiting)
    /// The answer `abandon()` gives.
    public let abandonedAnswer: HTTPResponse

    /// A response not decided yet, answered `abandoned` if the engine stops before it is
    /// (default: `PendingResponse.storeDidNotAnswer`).
    public init(abandoned: HTTPResponse = PendingResponse.storeDidNotAnswer) {
        abandonedAnswer = abandoned
    }

    /// The answer to a write whose store had not answered when the service stopped:
    /// `503 store_unavailable` with `Retry-After: 1` (the write may or may not have been stored,
    /// as for any `store_unavailable`; docs/http-api.md) and `Connection: close`, so that the
    /// client retries on another connection (another replica).
    public static let storeDidNotAnswer = HTTPResponse.error(
        503,
        ServiceError("store_unavailable", "the service stopped before the token's store confirmed the write; retry"),
        headers: ["Retry-After": "1", "Connection": "close"])

    /// The engine is stopping and the response is not decided yet: decides it as
    /// `abandonedAnswer` (and resumes a parked request). Does nothing once it is decided.
    public func abandon() {
        fulfil(abandonedAnswer)
    }

    /// Decides the response (the first call wins) and resumes a parked request.
    public func fulfil(_ response: HTTPResponse) {
        let resume: (@Sendable () -> Void)? = state.withLock { state in
            switch state {
            case .waiting:
                state = .ready(response)
                return nil
            case .parked(let resume):
                state = .ready(response)
                return resume
            case .ready, .taken:
                return nil
            }
        }
        resume?()
    }

    /// The response when it is decided (it is then taken: later calls return `nil`).
    public func takeIfReady() -> HTTPResponse? {
        state.withLock { state in
            guard case .ready(let response) = state else { return nil }
            state = .taken
            return response
        }
    }

    /// The response when it is decided; otherwise calls `park` under the lock and keeps `resume`
    /// to call once when it is. Returns `nil` then (and while parked, or after it was taken).
    public func take(orPark park: () -> Void, resume: @escaping @Sendable () -> Void) -> HTTPResponse? {
        state.withLock { state in
            switch state {
            case .ready(let response):
                state = .taken
                return response
            case .waiting:
                park()
                state = .parked(resume: resume)
                return nil
            case .parked, .taken:
                return nil
            }
        }
    }
}

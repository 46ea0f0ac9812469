import ForgePushToken

/// A response that is decided after the request's handler has returned: the answer to a write
/// whose commit is still in flight (a store that answers on its own thread).
///
/// One side (the commit's completion) calls `fulfil` once; the engine takes the response with
/// `takeIfReady()` at once, or with `take(orPark:resume:)`, which parks the request (the engine
/// suspends its connection, *under this object's lock*, so the suspension happens before any
/// `fulfil` can see it) and arranges for `resume` to be called once, outside the lock, when the
/// response arrives. The engine then calls `take(orPark:resume:)` again and gets it.
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

    /// A response not decided yet.
    public init() {}

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

import ForgePushToken
import ForgePushTokenOwner

/// The plainest rendition: the state itself.
extension TokenState: TokenRendition {
    public init(_ state: TokenState) { self = state }
    public var state: TokenState { self }
}

/// Commits `token` through `owner` and returns the outcome (the stores used here decide at once).
func commitNow<R>(_ owner: TokenOwner<R>, _ token: String?) -> CommitOutcome {
    let result = Locked<CommitOutcome?>(nil)
    owner.commit(token) { outcome in result.withLock { $0 = outcome } }
    return result.withLock { $0 }!
}

/// A subscriber that records what it is offered, for the owner's tests.
final class RecordingSubscriber: TokenSubscriber {
    struct State: Sendable {
        var offered: [TokenState] = []
        var ticks = 0
        var endings: [SubscriberEnding] = []
        var wakes = 0
    }

    let id: UInt64
    let state: Locked<State>

    init(id: UInt64, first: TokenState) {
        self.id = id
        self.state = Locked(State(offered: [first]))
    }

    func offer(_ rendition: TokenState) -> Bool {
        state.withLock { state in
            guard rendition.version > state.offered.last!.version else { return false }
            state.offered.append(rendition)
            return true
        }
    }

    func heartbeatTick() -> Bool {
        state.withLock {
            $0.ticks += 1
            return true
        }
    }
    func end(_ ending: SubscriberEnding) -> Bool {
        state.withLock {
            $0.endings.append(ending)
            return true
        }
    }
    func wake() { state.withLock { $0.wakes += 1 } }
    var offered: [TokenState] { state.withLock { $0.offered } }
}

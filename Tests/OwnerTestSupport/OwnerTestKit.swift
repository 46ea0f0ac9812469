import Dispatch
import ForgePushToken
import ForgePushTokenOwner

// The owner's testing kit: one scripted store, one recording subscriber and the two ways of waiting
// for a commit's outcome (`commitAtOnce`, `commitAndWait`), shared by the owner's, the HTTP
// layer's and the engine's tests instead of a copy in each.

/// The plainest rendition: the state itself, for tests of the owner that need no rendering.
extension TokenState: TokenRendition {
    /// `state` itself.
    public init(_ state: TokenState) { self = state }
    /// `self`.
    public var state: TokenState { self }
}

/// Commits `token` through `owner` (`TokenOwner.commit(_:)`, the path every store takes) and
/// returns the outcome. Only for stores that decide before `commit` returns (`ScriptedStore`
/// answering `.atOnce`, `MemoryTokenStore`): a pending commit stops the test at a precondition.
public func commitAtOnce<R>(_ owner: TokenOwner<R>, _ token: String?) -> CommitOutcome {
    guard case .decided(let outcome) = owner.commit(token) else {
        preconditionFailure("commitAtOnce: the store did not answer before commit returned")
    }
    return outcome
}

/// Commits `token` through `owner` and waits for the outcome, on whatever thread the store
/// answers (`StateFileStore` answers after the `fsync` of the batch that holds the write).
public func commitAndWait<R>(_ owner: TokenOwner<R>, _ token: String?) -> CommitOutcome {
    let result = Locked<CommitOutcome?>(nil)
    let answered = DispatchSemaphore(value: 0)
    owner.commit(token) { outcome in
        result.withLock { $0 = outcome }
        answered.signal()
    }
    answered.wait()
    guard let outcome = result.withLock({ $0 }) else { preconditionFailure("signalled without an outcome") }
    return outcome
}

extension TokenOwner {
    /// Commits `token` (`commit(_:)`) and gives the outcome to `completion`, exactly once: on this
    /// thread when it was decided at once, else on the store's thread. For tests that answer
    /// through a closure either way.
    public func commit(_ token: String?, completion: @escaping @Sendable (CommitOutcome) -> Void) {
        switch commit(token) {
        case .decided(let outcome):
            completion(outcome)
        case .pending(let pending):
            if let outcome = pending.outcome(orWhenDecided: completion) { completion(outcome) }
        }
    }
}

extension TokenStore {
    /// `commit(_:base:completion:)` with the outcome given to `completion` exactly once either way:
    /// on this thread when the store returned it, else when the store calls back. For tests that
    /// drive a store directly.
    public func commitEitherWay(
        _ token: String?, base: TokenState, completion: @escaping @Sendable (CommitOutcome) -> Void
    ) {
        if let outcome = commit(token, base: base, completion: completion) { completion(outcome) }
    }
}

/// A store for tests whose decisions are `MemoryTokenStore`'s (or one fixed outcome), answered at
/// once, after a delay on another thread, or when the test releases them; and whose reports
/// (changes from elsewhere, health) the test plays with `report(_:)`, as another replica's or a
/// failing dependency's would arrive.
///
/// Thread-safety: every member may be called from any thread.
public final class ScriptedStore: TokenStore {
    /// When a commit is answered.
    public enum Answering: Sendable, Equatable {
        /// Before `commit` returns (`.ownerSerialized`, as the local stores answer).
        case atOnce
        /// On another thread after the delay (`.storeSerialized`, as a shared store answers).
        case after(DispatchTimeInterval)
        /// When the test calls `release()`, oldest first (`.storeSerialized`).
        case whenReleased
    }

    private typealias Held = (token: String?, base: TokenState, completion: @Sendable (CommitOutcome) -> Void)

    /// When commits are answered.
    public let answering: Answering
    /// The outcome of every commit, or `nil` for `MemoryTokenStore`'s decision.
    public let outcome: CommitOutcome?
    private let memory = MemoryTokenStore()
    private let held = Locked<[Held]>([])
    /// The report closure in a class box: a closure kept directly in a `Locked` is re-wrapped in
    /// reabstraction thunks on every access (Sources/RedisTokenStore/RedisLink.swift, `ClosureBox`).
    private let reporter = Locked<Reporter?>(nil)

    private final class Reporter: Sendable {
        let report: @Sendable (TokenStoreEvent) -> Void
        init(_ report: @escaping @Sendable (TokenStoreEvent) -> Void) { self.report = report }
    }
    private let proposals = Locked<[String?]>([])

    /// A store answering `answering`, with `outcome` or the memory store's decision.
    public init(answering: Answering = .atOnce, outcome: CommitOutcome? = nil) {
        self.answering = answering
        self.outcome = outcome
    }

    /// `.ownerSerialized` when answering at once, `.storeSerialized` otherwise.
    public var ordering: CommitOrdering { answering == .atOnce ? .ownerSerialized : .storeSerialized }

    /// Records the proposal and answers it as `answering` says: returned at once, or through
    /// `completion` later.
    public func commit(_ token: String?, base: TokenState, completion: @escaping @Sendable (CommitOutcome) -> Void)
        -> CommitOutcome?
    {
        proposals.withLock { $0.append(token) }
        switch answering {
        case .atOnce:
            return decide(token, base: base)
        case .after(let delay):
            DispatchQueue.global().asyncAfter(deadline: .now() + delay) {
                completion(self.decide(token, base: base))
            }
        case .whenReleased:
            held.withLock { $0.append((token, base, completion)) }
        }
        return nil
    }

    /// Keeps `report` for `report(_:)`.
    public func start(
        reporting report: @escaping @Sendable (TokenStoreEvent) -> Void,
        current: @escaping @Sendable () -> TokenState
    ) {
        reporter.withLock { $0 = Reporter(report) }
    }

    /// Nothing to stop.
    public func stop() {}

    /// Reports `event` to the owner, as the store would on its own (after `start(reporting:current:)`;
    /// ignored before it).
    public func report(_ event: TokenStoreEvent) {
        reporter.withLock { $0 }?.report(event)
    }

    /// Answers the oldest held commit (`.whenReleased`). Returns `false` when none is held.
    @discardableResult
    public func release() -> Bool {
        guard let commit = held.withLock({ $0.isEmpty ? nil : $0.removeFirst() }) else { return false }
        commit.completion(decide(commit.token, base: commit.base))
        return true
    }

    /// The number of commits held (`.whenReleased`).
    public var heldCount: Int { held.withLock { $0.count } }

    /// Every token proposed to the store, in order.
    public var proposed: [String?] { proposals.withLock { $0 } }

    private func decide(_ token: String?, base: TokenState) -> CommitOutcome {
        if let outcome { return outcome }
        return memory.commit(token, base: base) { _ in } ?? .unknown(reason: "the memory store did not decide")
    }
}

/// A subscriber that records what it is offered, its heartbeat ticks, endings and wakes.
///
/// Thread-safety: every member may be called from any thread.
public final class RecordingSubscriber: TokenSubscriber {
    /// What the subscriber saw.
    public struct State: Sendable {
        /// Every state offered and taken, the first one included.
        public var offered: [TokenState] = []
        /// Heartbeat ticks.
        public var ticks = 0
        /// How it was ended, in order.
        public var endings: [SubscriberEnding] = []
        /// Why it was ended, in order (beside `endings`).
        public var reasons: [StreamEndReason] = []
        /// Wakes.
        public var wakes = 0
    }

    /// The id the owner gave it.
    public let id: UInt64
    /// What it saw.
    package let state: Locked<State>

    /// A subscriber whose first state is `first`.
    public init(id: UInt64, first: TokenState) {
        self.id = id
        self.state = Locked(State(offered: [first]))
    }

    /// Takes `rendition` when it is newer than the last one taken.
    public func offer(_ rendition: TokenState) -> Bool {
        state.withLock { state in
            guard rendition.version > state.offered.last!.version else { return false }
            state.offered.append(rendition)
            return true
        }
    }

    /// Counts the tick; always asks for a wake.
    public func heartbeatTick() -> Bool {
        state.withLock {
            $0.ticks += 1
            return true
        }
    }

    /// Records the ending; always asks for a wake.
    public func end(_ ending: SubscriberEnding, reason: StreamEndReason) -> Bool {
        state.withLock {
            $0.endings.append(ending)
            $0.reasons.append(reason)
            return true
        }
    }

    /// Counts the wake.
    public func wake() { state.withLock { $0.wakes += 1 } }

    /// Every state taken so far.
    public var offered: [TokenState] { state.withLock { $0.offered } }
}

import ForgePushToken
import ServerSupport

/// The one owner of the service's token: the versioned token, its subscribers and its store.
///
/// Every write goes through `commit(_:)`, which returns a value (`CommitResult`: decided now, or
/// pending), every
/// subscriber through `subscribe(_:)`, and every change, whether made here or reported by the
/// store, reaches the subscribers from here: nothing else publishes. The state lives in a `TokenOwnerStateMachine` behind one lock; the
/// owner runs each event through the machine under that lock and carries out the actions (offers,
/// wake-ups, the store's I/O, completions) after releasing it. So a reader (`current`, `version`)
/// never waits behind a commit in flight: a store's `fsync` or network round trip happens outside
/// the lock.
///
/// A store with `.ownerSerialized` ordering gets its commits one at a time, each on the state the
/// previous one produced (a second lock, `commits`, serialises writers only; the state lock nests
/// inside it, never the other way round). Every store is asked through its one
/// `TokenStore.commit(_:base:completion:)`: a store that decides before the call returns returns
/// the outcome, so a write on a local store makes no closure, no pending answer and takes no lock
/// beyond these two.
///
/// Thread-safety: all members may be called from any thread, concurrently.
public final class TokenOwner<Rendition: TokenRendition>: Sendable {
    /// A subscriber of this owner.
    public typealias Subscriber = any TokenSubscriber<Rendition>

    @usableFromInline let machine: Locked<TokenOwnerStateMachine<Rendition>>
    /// The store's health and whether shutdown has begun, copied from `machine` whenever either
    /// changes, while `machine`'s lock is held (so copies never arrive out of order): the HTTP
    /// layer's probes read it without taking the owner's lock (docs/operations.md, "Probes"). Its
    /// lock nests inside `machine`'s and takes no other.
    @usableFromInline let board: Locked<Board>

    /// What `board` holds.
    @usableFromInline struct Board: Sendable {
        @usableFromInline var health: StoreHealth
        @usableFromInline var isStopping: Bool

        @usableFromInline init(health: StoreHealth, isStopping: Bool) {
            self.health = health
            self.isStopping = isStopping
        }
    }
    /// Serialises the commits of an `.ownerSerialized` store (`nil` for another store); its value
    /// counts the commits it ran (a lock over an empty value, `Void`, makes Thread Sanitizer report
    /// its own accesses as races: the value's address is the buffer's).
    @usableFromInline let commits: Locked<UInt64>?
    /// Where the state is kept.
    public let store: any TokenStore

    /// Creates the owner of `initial` (what `store` held at start), kept by `store`, admitting at
    /// most `maxSubscribers` (≥ 1) subscribers. Call `start()` before the first commit.
    public init(store: any TokenStore, initial: TokenState, health: StoreHealth = .ok, maxSubscribers: Int) {
        self.store = store
        let machine = TokenOwnerStateMachine<Rendition>(
            initial: initial, health: health, maxSubscribers: maxSubscribers)
        self.board = Locked(Board(health: machine.health, isStopping: machine.isStopping))
        self.machine = Locked(machine)
        self.maxSubscribers = maxSubscribers
        self.commits = store.ordering == .ownerSerialized ? Locked(0) : nil
    }

    /// Starts the store's reports (changes from elsewhere, health). Call once, before the first
    /// commit.
    public func start() {
        store.start(
            reporting: { [weak self] event in self?.storeReported(event) },
            current: { [weak self] in self?.machine.withLock { $0.current.state } ?? .initial })
    }

    /// Shutdown's final step, after the HTTP server has stopped (`stop()`, then the server's own
    /// shutdown): stops the store's background work (`TokenStore.stop()`). Writes still in flight
    /// during graceful shutdown keep their store until then. Call once; commits after it are
    /// answered by a stopped store (`.unavailable`, or `.stopping` since `stop()` came first).
    public func close() {
        store.stop()
    }

    // MARK: Reading

    /// The current rendition (the newest state applied).
    @inlinable public var current: Rendition { machine.withLock { $0.current } }

    /// The current version alone (nothing is copied or retained).
    @inlinable public var version: UInt64 { machine.withLock { $0.current.state.version } }

    /// The store's health. Read without the owner's lock (a copy the owner keeps current), so a
    /// probe answers while a commit holds it.
    public var health: StoreHealth { board.withLock { $0.health } }

    /// Whether graceful shutdown has begun (`stop()`). Read without the owner's lock, as `health`.
    public var isStopping: Bool { board.withLock { $0.isStopping } }

    /// Runs `body` on the machine under its lock and, when it changed the health or the phase,
    /// copies them to `board` before the lock is released.
    @inlinable
    func transition<R: Sendable>(_ body: (inout TokenOwnerStateMachine<Rendition>) -> R) -> R {
        machine.withLock { machine in
            let health = machine.health
            let stopping = machine.isStopping
            let result = body(&machine)
            if machine.health != health || machine.isStopping != stopping {
                board.withLock { $0 = Board(health: machine.health, isStopping: machine.isStopping) }
            }
            return result
        }
    }

    /// The most subscribers at once.
    public let maxSubscribers: Int

    /// The number of subscribers.
    public var subscriberCount: Int { machine.withLock { $0.subscriberCount } }

    // MARK: Writing

    /// Proposes `token` (lowercase hex, or `nil` to clear) to the store and applies its decision:
    /// a newer state becomes current and reaches every subscriber before the outcome is given.
    /// The one commit path, for every store (`TokenStore.commit(_:base:completion:)`), returning a
    /// value:
    /// - `.decided(outcome)` when the store decided before returning (always for the local stores,
    ///   `.ownerSerialized`; a state file's write of the current token; a Redis known to be down);
    /// - `.pending(commit)` when it decides later (`.storeSerialized`: the state file, Redis): the
    ///   outcome is applied on the store's thread, then handed to the caller through `commit`
    ///   (`PendingCommit.outcome(orWhenDecided:)`).
    ///
    /// Once `stop()` has been called the outcome is `.stopping`, decided, and the store is not
    /// asked.
    @inlinable
    public func commit(_ token: String?) -> CommitResult {
        guard let commits else {
            guard let base = machine.withLock({ $0.beginCommit() }) else { return .decided(.stopping) }
            let pending = PendingCommit()
            let decided = store.commit(token, base: base) { [self] outcome in
                finish(outcome)
                pending.decide(outcome)
            }
            guard let decided else { return .pending(pending) }
            finish(decided)
            return .decided(decided)
        }
        let (outcome, delivery, drained) = commits.withLock {
            count -> (CommitOutcome, TokenOwnerStateMachine<Rendition>.Delivery?, [Subscriber]) in
            count &+= 1
            guard let base = machine.withLock({ $0.beginCommit() }) else { return (.stopping, nil, []) }
            // A store of this ordering decides before it returns (`TokenStore`'s contract); one
            // that does not is answered `.unknown`, and its completion changes nothing.
            let outcome =
                store.commit(token, base: base) { _ in }
                ?? .unknown(reason: "the store did not decide before its commit returned")
            // Applied before the next commit takes its base: each commit decides on the one before.
            let (delivery, drained) = transition { ($0.committed(outcome), $0.finishIfDrained()) }
            return (outcome, delivery, drained)
        }
        deliver(delivery)
        finishStreams(drained)
        return .decided(outcome)
    }

    /// Applies `outcome`, of a commit begun with `beginCommit()`, and delivers what it decided.
    @inlinable
    func finish(_ outcome: CommitOutcome) {
        let (delivery, drained) = transition { ($0.committed(outcome), $0.finishIfDrained()) }
        deliver(delivery)
        finishStreams(drained)
    }

    /// Ends `subscribers` cleanly (after what is pending for them) and wakes those that wait:
    /// graceful shutdown's end of the streams (`StreamEndReason.shutdown`).
    @inlinable
    func finishStreams(_ subscribers: [Subscriber]) {
        WakeBatch.run {
            for subscriber in subscribers where subscriber.end(.finish, reason: .shutdown) {
                subscriber.wake()
            }
        }
    }

    private func storeReported(_ event: TokenStoreEvent) {
        deliver(transition { $0.storeReported(event) })
    }

    @inlinable
    func deliver(_ delivery: TokenOwnerStateMachine<Rendition>.Delivery?) {
        guard let delivery else { return }
        let rendition = delivery.rendition.prepared()
        // One batch: the engine wakes each of its event loops once, after the last offer.
        WakeBatch.run {
            for subscriber in delivery.subscribers where subscriber.offer(rendition) {
                subscriber.wake()
            }
        }
    }

    // MARK: Subscribers

    /// Registers a subscriber built by `make` from its id and the current rendition (its first
    /// event), in the same step: no change is lost or sent twice.
    /// - Returns: the subscriber's `Subscription`: the subscriber, and the handle its connection
    ///   ends it with (`cancel()`, `abort()`), so that nothing in between routes its id.
    /// - Throws: `Refusal.full` at `maxSubscribers`, `Refusal.stopping` after `stop()`.
    public func subscribe<Made: TokenSubscriber<Rendition>>(_ make: (UInt64, Rendition) -> Made)
        throws(TokenOwnerStateMachine<Rendition>.Refusal) -> Subscription<Made>
    {
        var made: Made?
        _ = try machine.withLock { machine in
            machine.subscribe { id, first in
                let subscriber = make(id, first)
                made = subscriber
                return subscriber
            }
        }.get()
        guard let made else { preconditionFailure("the state machine admitted a subscriber it did not make") }
        return Subscription(subscriber: made, owner: self)
    }

    /// One subscriber's registration with this owner, as `subscribe(_:)` returns it: the subscriber
    /// and the calls its connection makes when it ends. Its connection keeps it (the HTTP engine's
    /// event stream) and calls exactly one of `cancel()` (the connection is gone) or `abort()`
    /// (its client has left) first, or both; either is idempotent.
    ///
    /// A value type; `Sendable`. Holds its owner strongly: the owner never holds a subscription, so
    /// there is no cycle.
    public struct Subscription<Made: TokenSubscriber<Rendition>>: Sendable {
        /// The subscriber, as `make` built it.
        public let subscriber: Made
        private let owner: TokenOwner

        init(subscriber: Made, owner: TokenOwner) {
            self.subscriber = subscriber
            self.owner = owner
        }

        /// The subscriber's id within its owner.
        public var id: UInt64 { subscriber.id }

        /// The subscriber's connection is gone (its response was freed): the owner forgets it
        /// (`TokenOwner.unsubscribe`). Idempotent.
        public func cancel() {
            owner.unsubscribe(subscriber.id)
        }

        /// The subscriber's client has left (its socket closed): its stream ends at once
        /// (`TokenOwner.abort`). Idempotent.
        public func abort() {
            owner.abort(subscriber.id)
        }
    }

    /// Removes subscriber `id` (its connection is gone). Unknown ids are ignored.
    public func unsubscribe(_ id: UInt64) {
        machine.withLock { $0.unsubscribe(id) }
    }

    /// Ends subscriber `id` at once (its client has gone: `StreamEndReason.client`). Unknown ids
    /// are ignored.
    public func abort(_ id: UInt64) {
        guard let subscriber = machine.withLock({ $0.subscriber(id) }) else { return }
        if subscriber.end(.abort, reason: .client) { subscriber.wake() }
    }

    /// Ends subscriber `id` cleanly, after the event it is writing and any pending one (a drain's
    /// scheduled end, an age limit, a revoked credential), counted under `reason`. Unknown ids
    /// (a subscriber already gone) are ignored.
    public func finish(_ id: UInt64, reason: StreamEndReason) {
        guard let subscriber = machine.withLock({ $0.subscriber(id) }) else { return }
        if subscriber.end(.finish, reason: reason) { subscriber.wake() }
    }

    /// The ids of the subscribers now, in no particular order (a drain's schedule is drawn over
    /// them).
    public var subscriberIDs: [UInt64] { machine.withLock { $0.subscriberIDs } }

    /// Ends cleanly (after a whole event, as `finish(_:reason:)` does) every subscriber for which
    /// `shouldEnd` holds, counted under `reason`, and wakes those that wait: the HTTP layer's
    /// streams whose token was revoked (docs/operations.md, "Rotating tokens"). `shouldEnd` runs
    /// outside the owner's lock, on this thread.
    /// - Returns: how many subscribers were picked.
    @discardableResult
    public func finish(reason: StreamEndReason, where shouldEnd: (Subscriber) -> Bool) -> Int {
        let picked = machine.withLock { $0.everySubscriber() }.filter(shouldEnd)
        for subscriber in picked where subscriber.end(.finish, reason: reason) {
            subscriber.wake()
        }
        return picked.count
    }

    /// One heartbeat period has passed: idle subscribers get a heartbeat.
    public func heartbeat() {
        for subscriber in machine.withLock({ $0.heartbeat() }) where subscriber.heartbeatTick() {
            subscriber.wake()
        }
    }

    /// Begins graceful shutdown: refuses new subscribers and new writes, and ends every
    /// subscription cleanly: at once, or, while writes are with the store, when the last of them
    /// has come back and reached the subscribers (a store answers within its own timeout; the
    /// engine's grace period and `abortAll()` bound the wait). Idempotent. The one stopping state
    /// of the service (`isStopping`).
    public func stop() {
        finishStreams(transition { $0.stop() })
    }

    /// Shutdown's last step: ends every remaining subscription at once
    /// (`StreamEndReason.shutdown`).
    public func abortAll() {
        for subscriber in machine.withLock({ $0.abortAll() }) where subscriber.end(.abort, reason: .shutdown) {
            subscriber.wake()
        }
    }
}

/// What `TokenOwner.commit(_:)` returns: the outcome, decided now, or a commit whose store
/// decides later.
///
/// A value type; `Sendable`.
public enum CommitResult: Sendable {
    /// The store decided before its commit returned (or the owner is stopping): the outcome is
    /// applied already.
    case decided(CommitOutcome)
    /// The store decides on its own thread: the outcome arrives through the `PendingCommit`.
    case pending(PendingCommit)
}

/// A commit whose store decides later (`CommitResult.pending`): the owner applies the outcome when
/// the store gives it, then decides this; the caller takes the outcome with
/// `outcome(orWhenDecided:)`, once.
///
/// Thread-safety: all members may be called from any thread. One lock, a leaf: `decide` and
/// `outcome(orWhenDecided:)` take it to hand the outcome over, and the caller's closure runs after
/// it is released.
public final class PendingCommit: Sendable {
    @usableFromInline enum State: Sendable {
        case waiting
        case observed(@Sendable (CommitOutcome) -> Void)
        case decided(CommitOutcome)
        case taken
    }

    @usableFromInline let state = Locked(State.waiting)

    @usableFromInline init() {}

    /// The outcome, when decided already (it is then taken); otherwise keeps `body`, to call once
    /// with the outcome, on the store's thread, when it is decided, and returns `nil`. Call once:
    /// a later call returns `nil` and its `body` is never called.
    public func outcome(orWhenDecided body: @escaping @Sendable (CommitOutcome) -> Void) -> CommitOutcome? {
        state.withLock { state in
            switch state {
            case .decided(let outcome):
                state = .taken
                return outcome
            case .waiting:
                state = .observed(body)
                return nil
            case .observed, .taken:
                return nil
            }
        }
    }

    /// The owner applied `outcome`: hands it to the caller (the first call wins).
    @usableFromInline func decide(_ outcome: CommitOutcome) {
        let observer: (@Sendable (CommitOutcome) -> Void)? = state.withLock { state in
            switch state {
            case .waiting:
                state = .decided(outcome)
                return nil
            case .observed(let body):
                state = .taken
                return body
            case .decided, .taken:
                return nil
            }
        }
        observer?(outcome)
    }
}

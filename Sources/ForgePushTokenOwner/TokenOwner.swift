import ForgePushToken
import ServerSupport
import Synchronization

/// The one owner of the service's token: the versioned token, its subscribers and its store.
///
/// Every write goes through `commit(_:later:)` (or `commit(_:completion:)`, the same path), every
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
/// `TokenStore.commit(_:base:completion:)`: a store that answers before the call returns is
/// given the owner's `OutcomeSlot` completion, made once, so a write on a local store makes no
/// closure, no pending answer and takes no lock beyond these two.
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
    /// Serialises the commits of an `.ownerSerialized` store (`nil` for another store), over the
    /// slot its completion fills: the slot is only used by the thread that holds this lock.
    @usableFromInline let commits: Locked<OutcomeSlot>?
    /// The completion an `.ownerSerialized` store is given: fills the slot (`OutcomeSlot.fill`).
    /// Made once, with the owner, so that a commit makes no closure.
    @usableFromInline let fillSlot: @Sendable (CommitOutcome) -> Void
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
        let slot = OutcomeSlot()
        self.commits = store.ordering == .ownerSerialized ? Locked(slot) : nil
        self.fillSlot = { outcome in slot.fill(outcome) }
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
    /// The one commit path, for every store (`TokenStore.commit(_:base:completion:)`):
    /// - a store that answers before its call returns (`.ownerSerialized`: the local stores):
    ///   the outcome is returned, and `later` is not called;
    /// - a store that answers later (`.storeSerialized`: the state file, Redis): `later` is
    ///   called once, on this thread, for the completion that receives the outcome, and `nil` is
    ///   returned; the completion runs exactly once, on the store's thread or on this one.
    ///
    /// Once `stop()` has been called the outcome is `.stopping`, returned, and the store is not
    /// asked. `later` is not escaping, so a caller makes what it needs for a later answer (a
    /// pending response, a closure) only when there will be one.
    @inlinable
    public func commit(
        _ token: String?, later: () -> (@Sendable (CommitOutcome) -> Void)
    ) -> CommitOutcome? {
        guard let commits else {
            guard let base = machine.withLock({ $0.beginCommit() }) else { return .stopping }
            let completion = later()
            store.commit(token, base: base) { [self] outcome in
                finish(outcome, completion: completion)
            }
            return nil
        }
        let (outcome, delivery, drained) = commits.withLock {
            slot -> (CommitOutcome, TokenOwnerStateMachine<Rendition>.Delivery?, [Subscriber]) in
            guard let base = machine.withLock({ $0.beginCommit() }) else { return (.stopping, nil, []) }
            store.commit(token, base: base, completion: fillSlot)
            let outcome = slot.take()
            // Applied before the next commit takes its base: each commit decides on the one before.
            let (delivery, drained) = transition { ($0.committed(outcome), $0.finishIfDrained()) }
            return (outcome, delivery, drained)
        }
        deliver(delivery)
        finishStreams(drained)
        return outcome
    }

    /// `commit(_:later:)` with the completion made up front: `completion` runs exactly once, on
    /// this thread when the store decides at once, else on the store's thread. The same path;
    /// for callers that answer through a closure either way.
    @inlinable
    public func commit(_ token: String?, completion: @escaping @Sendable (CommitOutcome) -> Void) {
        if let outcome = commit(token, later: { completion }) { completion(outcome) }
    }

    @inlinable
    func finish(_ outcome: CommitOutcome, completion: @Sendable (CommitOutcome) -> Void) {
        let (delivery, drained) = transition { ($0.committed(outcome), $0.finishIfDrained()) }
        deliver(delivery)
        finishStreams(drained)
        completion(outcome)
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

/// Where an `.ownerSerialized` store's completion leaves its outcome for the committing thread:
/// one per owner, made with it, used by the thread that holds the owner's `commits` lock. The
/// store calls `fill` before its `commit` returns (the `TokenStore` contract for that ordering);
/// the owner then calls `take`. An atomic phase, not a lock, orders the two: a write costs two
/// uncontended atomic operations here, no allocation.
///
/// Why `@unchecked Sendable` is sound: `outcome` is written only by the one `fill` that moves
/// `phase` from `open` to `filling` (a second `fill` in one round, or a late one from another
/// thread after `take` closed the round, stops at a precondition instead of writing), and
/// published by its release store of `filled`; it is read only by `take`, after its
/// compare-exchange from `filled` (acquiring) succeeded, which reopens the slot for the next
/// round. Rounds never overlap: each runs whole under the owner's `commits` lock. So every write
/// of `outcome` happens before its read, and no two accesses are concurrent.
@usableFromInline
final class OutcomeSlot: @unchecked Sendable {
    /// `open` (waiting for `fill`), `filling`, `filled` (waiting for `take`), or `closed` (the
    /// store broke its contract: nothing may be written any more).
    @usableFromInline let phase = Atomic<UInt8>(OutcomeSlot.open)
    @usableFromInline var outcome: CommitOutcome = .stopping

    @usableFromInline static let open: UInt8 = 0
    @usableFromInline static let filling: UInt8 = 1
    @usableFromInline static let filled: UInt8 = 2
    @usableFromInline static let closed: UInt8 = 3

    @usableFromInline init() {}

    /// The store's completion: keeps `outcome` for `take`.
    @usableFromInline func fill(_ outcome: CommitOutcome) {
        guard phase.compareExchange(expected: Self.open, desired: Self.filling, ordering: .acquiring).exchanged else {
            preconditionFailure("a store with owner-serialized ordering completed a commit twice, or after it returned")
        }
        self.outcome = outcome
        phase.store(Self.filled, ordering: .releasing)
    }

    /// The outcome `fill` kept, after the store's `commit` returned; reopens the slot.
    @inlinable func take() -> CommitOutcome {
        guard phase.compareExchange(expected: Self.filled, desired: Self.open, ordering: .acquiring).exchanged else {
            phase.store(Self.closed, ordering: .relaxed)
            preconditionFailure("a store with owner-serialized ordering must complete before commit returns")
        }
        return outcome
    }
}

/// The owner's state and its transitions: a plain value with no lock and no I/O, in the shape of
/// swift-async-algorithms' channel state machines. Every event is a `mutating` method that
/// returns what must be done about it (the action); `TokenOwner` runs it under its one lock and
/// carries the action out after releasing it. So each transition can be tested as a value.
///
/// What it keeps: the current rendition of the versioned token (the only copy of the token in the
/// service), the store's health, the subscribers, and one phase (`running` or `stopping`).
/// Versions only go forward: a state at or below the current version is never applied.
public struct TokenOwnerStateMachine<Rendition: TokenRendition>: Sendable {
    /// A subscriber as the machine holds it.
    public typealias Subscriber = any TokenSubscriber<Rendition>

    /// Why a subscription was refused.
    public enum Refusal: Error, Sendable, Equatable {
        /// `maxSubscribers` are already subscribed.
        case full
        /// The owner is stopping.
        case stopping
    }

    /// Subscribers to hand a new rendition to: the owner offers it to each and wakes those that
    /// were waiting.
    public struct Delivery: Sendable {
        /// The rendition of the newly applied state.
        public let rendition: Rendition
        /// Every subscriber at the moment it was applied.
        public let subscribers: [Subscriber]

        @usableFromInline init(rendition: Rendition, subscribers: [Subscriber]) {
            self.rendition = rendition
            self.subscribers = subscribers
        }
    }

    // The commit path (`beginCommit()`, `committed(_:)`, `finishIfDrained()` and what they call)
    // is `@inlinable`, so that it is specialised for the service's rendition in the module that
    // runs it (`TokenOwner.commit` is inlined there too). Unspecialised, every commit looked up
    // the generic metadata of `Delivery`, of the machine and of the subscriber list's element
    // (an extended existential) at run time: about 2,000 instructions of a `POST /register`'s
    // 56,000 (docs/performance.md, "What the hot paths avoid"). Hence the stored properties it
    // touches are `@usableFromInline` storage behind read-only public views.

    /// The current rendition.
    @inlinable public var current: Rendition { storedCurrent }
    /// `current`, written only by this machine's transitions.
    @usableFromInline var storedCurrent: Rendition
    /// The store's health, from its reports and the outcomes of commits; `.degraded` with
    /// `StoreHealth.versionExhausted` while the current version is 2^64 - 1 and `health` would
    /// otherwise be `.ok` (every change is refused then, so the service is not well).
    @inlinable public var health: StoreHealth { storedHealth }
    /// `health`, written only by this machine's transitions.
    @usableFromInline var storedHealth: StoreHealth
    /// Whether `stop()` has happened.
    @inlinable public var isStopping: Bool { storedIsStopping }
    /// `isStopping`, written only by this machine's transitions.
    @usableFromInline var storedIsStopping = false
    /// Commits proposed to the store (`beginCommit()`) whose outcome has not come back yet.
    @inlinable public var commitsInFlight: Int { storedCommitsInFlight }
    /// `commitsInFlight`, written only by this machine's transitions.
    @usableFromInline var storedCommitsInFlight = 0
    /// `stop()` happened while commits were in flight: the subscribers are finished when the last
    /// one comes back (`finishIfDrained()`), after its change has reached them.
    @usableFromInline var finishPending = false
    /// The most subscribers at once.
    public let maxSubscribers: Int
    @usableFromInline var subscribers: [UInt64: Subscriber] = [:] {
        didSet { listed = nil }
    }
    /// `subscribers.values` as an array, made by the first delivery after a subscriber came or
    /// went and kept until the next one does: a delivery hands out this array (one reference)
    /// instead of copying tens of thousands of subscribers, each retained, under the owner's lock.
    @usableFromInline var listed: [Subscriber]?
    private var nextSubscriberID: UInt64 = 0

    /// A machine whose current state is `initial`, admitting at most `maxSubscribers` (≥ 1).
    public init(initial: TokenState, health: StoreHealth = .ok, maxSubscribers: Int) {
        precondition(maxSubscribers >= 1, "maxSubscribers must be at least 1")
        self.storedCurrent = Rendition(initial)
        self.storedHealth = health
        self.maxSubscribers = maxSubscribers
        noteVersionExhaustion()
    }

    /// The number of subscribers.
    public var subscriberCount: Int { subscribers.count }

    /// The ids of the subscribers, in no particular order.
    public var subscriberIDs: [UInt64] { Array(subscribers.keys) }

    // MARK: Events

    /// A subscriber asks to join. `make` builds it from its id and the current rendition (its first
    /// event), in the same step that registers it, so no change is lost or sent twice.
    /// - Returns: the new subscriber, or why it was refused.
    public mutating func subscribe(_ make: (UInt64, Rendition) -> Subscriber) -> Result<Subscriber, Refusal> {
        if isStopping { return .failure(.stopping) }
        if subscribers.count >= maxSubscribers { return .failure(.full) }
        let subscriber = make(nextSubscriberID, current)
        nextSubscriberID += 1
        subscribers[subscriber.id] = subscriber
        return .success(subscriber)
    }

    /// A subscriber left (its connection is gone). Unknown ids are ignored.
    public mutating func unsubscribe(_ id: UInt64) {
        subscribers.removeValue(forKey: id)
    }

    /// The subscriber with `id`, to end at once (its client has gone); `nil` when unknown.
    public func subscriber(_ id: UInt64) -> Subscriber? {
        subscribers[id]
    }

    /// Every subscriber, for the owner to end those a caller picks (`TokenOwner.finish(where:)`).
    public func everySubscriber() -> [Subscriber] {
        listed ?? Array(subscribers.values)
    }

    /// A commit finished with `outcome` (one begun with `beginCommit()` is no longer in flight).
    /// - Returns: the delivery to make when the outcome carries a newer state.
    @inlinable
    public mutating func committed(_ outcome: CommitOutcome) -> Delivery? {
        if storedCommitsInFlight > 0 { storedCommitsInFlight -= 1 }
        switch outcome {
        case .applied, .unchanged:
            if storedHealth == .degraded(reason: .stateNotSaved) { storedHealth = .ok }
        case .notSaved:
            storedHealth = .degraded(reason: .stateNotSaved)
        case .versionExhausted:
            // Every change will be refused alike: say so, unless health already names a problem.
            if storedHealth == .ok { storedHealth = .degraded(reason: .versionExhausted) }
        case .unknown, .unavailable, .stopping:
            break
        }
        let delivery = outcome.state.flatMap { apply($0) }
        noteVersionExhaustion()
        return delivery
    }

    /// The store reported `event`.
    /// - Returns: the delivery to make when it carries a newer state.
    public mutating func storeReported(_ event: TokenStoreEvent) -> Delivery? {
        switch event {
        case .changed(let state):
            defer { noteVersionExhaustion() }
            return apply(state)
        case .health(let health):
            storedHealth = health
            noteVersionExhaustion()
            return nil
        }
    }

    /// One heartbeat period has passed.
    /// - Returns: the subscribers to tick.
    public func heartbeat() -> [Subscriber] {
        listed ?? Array(subscribers.values)
    }

    /// A write is about to be proposed to the store.
    /// - Returns: the state to propose it on, or `nil` once stopping (the write is not proposed:
    ///   no change may be made after every subscriber has had its last event).
    @inlinable
    public mutating func beginCommit() -> TokenState? {
        guard !storedIsStopping else { return nil }
        storedCommitsInFlight += 1
        return current.state
    }

    /// Graceful shutdown begins: no new subscriber is admitted and no write proposed from now on.
    /// - Returns: the subscribers to finish cleanly; empty when already stopping, and empty while
    ///   commits are in flight: then their subscribers are finished when the last one has come
    ///   back and its change has reached them (`finishIfDrained()`), so that a write answered
    ///   `200` during shutdown is on every stream before it ends (attack finding).
    public mutating func stop() -> [Subscriber] {
        guard !isStopping else { return [] }
        storedIsStopping = true
        guard commitsInFlight == 0 else {
            finishPending = true
            return []
        }
        return listed ?? Array(subscribers.values)
    }

    /// After a commit came back (`committed(_:)`): the subscribers to finish now that the last
    /// commit in flight at `stop()` has come back; empty otherwise.
    @inlinable
    public mutating func finishIfDrained() -> [Subscriber] {
        guard finishPending, commitsInFlight == 0 else { return [] }
        finishPending = false
        return listed ?? Array(subscribers.values)
    }

    /// Shutdown's last step.
    /// - Returns: every remaining subscriber, to abort.
    public func abortAll() -> [Subscriber] {
        listed ?? Array(subscribers.values)
    }

    /// A service at version 2^64 - 1 refuses every change (`TokenState.versionExhausted`): it
    /// says so in its health instead of `ok`. A health that already names a problem is kept.
    @inlinable
    mutating func noteVersionExhaustion() {
        if storedCurrent.state.version == .max, storedHealth == .ok {
            storedHealth = .degraded(reason: .versionExhausted)
        }
    }

    @inlinable
    mutating func apply(_ state: TokenState) -> Delivery? {
        guard state.version > storedCurrent.state.version else { return nil }
        storedCurrent = Rendition(state)
        if subscribers.isEmpty { return nil }
        let list = listed ?? Array(subscribers.values)
        listed = list
        return Delivery(rendition: current, subscribers: list)
    }
}

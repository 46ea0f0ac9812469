import ForgePushToken

/// The subscribers of `GET /token/stream` and the fan-out of each new snapshot to them.
///
/// One task (`run(service:)`) iterates the manager's `tokenStream`; on each emission it takes the
/// service's current snapshot and offers it to every subscriber, which sends it only when its
/// version is newer than the last one that subscriber was offered. A new subscriber gets the
/// current snapshot as its first event, taken in the same critical section that registers it, so
/// no change is lost or sent twice.
///
/// The hub knows nothing of sockets: a subscriber's `wake` closure, given at `subscribe`, resumes
/// its connection; it is called outside every lock of the hub.
///
/// Thread-safety: all members may be called from any thread.
public final class EventHub: Sendable {
    /// Why `subscribe` refused.
    public enum Refusal: Error, Sendable, Equatable {
        /// `maxSubscribers` are already connected.
        case full
        /// The service is shutting down.
        case closing
    }

    struct Entry {
        let subscriber: EventSubscriber
        let wake: @Sendable () -> Void
    }

    struct State {
        var entries: [UInt64: Entry] = [:]
        var nextID: UInt64 = 0
        var closing = false
    }

    /// The most subscribers at once; more are refused with `.full`.
    public let maxSubscribers: Int
    private let service: TokenService
    private let state = Locked(State())

    /// Creates a hub for `service`'s snapshots, admitting at most `maxSubscribers` (≥ 1).
    public init(service: TokenService, maxSubscribers: Int) {
        precondition(maxSubscribers >= 1, "maxSubscribers must be at least 1")
        self.service = service
        self.maxSubscribers = maxSubscribers
    }

    /// The number of subscribers currently registered.
    public var count: Int {
        state.withLock { $0.entries.count }
    }

    /// Registers a subscriber whose first event is the current snapshot.
    /// - Parameter wake: resumes the subscriber's connection; called when `offer`, a heartbeat or
    ///   an ending finds it suspended.
    /// - Throws: `Refusal.full` at `maxSubscribers`, `Refusal.closing` after `close()`.
    public func subscribe(wake: @escaping @Sendable () -> Void) throws(Refusal) -> EventSubscriber {
        let outcome: Result<EventSubscriber, Refusal> = state.withLock { state in
            if state.closing { return .failure(.closing) }
            if state.entries.count >= maxSubscribers { return .failure(.full) }
            let subscriber = EventSubscriber(id: state.nextID, first: service.snapshot)
            state.nextID += 1
            state.entries[subscriber.id] = Entry(subscriber: subscriber, wake: wake)
            return .success(subscriber)
        }
        return try outcome.get()
    }

    /// Removes a subscriber (its connection is gone). Unknown ids are ignored.
    public func remove(_ id: UInt64) {
        _ = state.withLock { $0.entries.removeValue(forKey: id) }
    }

    /// Offers `snapshot` to every subscriber and wakes those that were waiting.
    public func publish(_ snapshot: TokenSnapshot) {
        forEachEntry { $0.offer(snapshot) }
    }

    /// One heartbeat period has passed: idle subscribers get a `: keep-alive` comment.
    public func heartbeatTick() {
        forEachEntry { $0.heartbeatTick() }
    }

    /// Ends the stream of subscriber `id` at once (its client has gone).
    public func abort(_ id: UInt64) {
        guard let entry = state.withLock({ $0.entries[id] }) else { return }
        if entry.subscriber.end(.abort) { entry.wake() }
    }

    /// Ends every stream at once, without a clean end (the last step of shutdown).
    public func abortAll() {
        forEachEntry { $0.end(.abort) }
    }

    /// Refuses new subscribers from now on and ends every stream cleanly (graceful shutdown).
    public func close() {
        state.withLock { $0.closing = true }
        forEachEntry { $0.end(.finish) }
    }

    /// Follows `service.manager.tokenStream` until the task is cancelled or the stream ends,
    /// publishing the service's snapshot on each emission.
    public func run() async {
        for await _ in service.manager.tokenStream {
            publish(service.snapshot)
        }
    }

    private func forEachEntry(_ transition: (EventSubscriber) -> Bool) {
        let woken = state.withLock { state in
            state.entries.values.filter { transition($0.subscriber) }
        }
        for entry in woken { entry.wake() }
    }
}

import ForgePushToken

/// The subscribers of `GET /token/stream` and the fan-out of each new snapshot to them.
///
/// Each new snapshot is offered to every subscriber (`publish`), which sends it only when its
/// version is newer than the last one that subscriber was offered. The `Responder` publishes the
/// snapshot of every change it makes, on the thread that made it, right after the service's lock
/// is released: no task hop or thread wake-up per change, and with no subscriber a publish costs
/// one lock. (`run()` instead follows the manager's `tokenStream`, for a hub whose service is
/// changed by other code; publishing the same version twice is harmless.) A new subscriber gets the
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

    /// Events written to subscribers, and events skipped because a newer one replaced them unwritten.
    public struct EventCounts: Sendable, Equatable {
        /// Events started on a subscriber's connection.
        public var sent: UInt64
        /// Events a slow subscriber skipped (conflation).
        public var skipped: UInt64
    }

    struct State {
        /// The counts of subscribers already removed.
        var retired = EventCounts(sent: 0, skipped: 0)
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

    /// Each subscriber's `bufferedByteCount`, for tests that prove memory stays bounded.
    package func bufferedByteCounts() -> [Int] {
        state.withLock { $0.entries.values.map(\.subscriber.bufferedByteCount) }
    }

    /// Removes a subscriber (its connection is gone). Unknown ids are ignored.
    public func remove(_ id: UInt64) {
        state.withLock { state in
            guard let entry = state.entries.removeValue(forKey: id) else { return }
            let counts = entry.subscriber.eventCounts
            state.retired.sent += counts.sent
            state.retired.skipped += counts.skipped
        }
    }

    /// Events sent and skipped since the hub was made, over every subscriber past and present.
    public var eventCounts: EventCounts {
        state.withLock { state in
            state.entries.values.reduce(into: state.retired) { total, entry in
                let counts = entry.subscriber.eventCounts
                total.sent += counts.sent
                total.skipped += counts.skipped
            }
        }
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
    /// publishing the service's snapshot on each emission. Not needed when every change goes
    /// through a `Responder`, which publishes them itself.
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

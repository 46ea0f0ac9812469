import ForgePushToken
import ForgePushTokenOwner
import ServerSupport

/// The Redis store's way to the owner: the owner's report closure and state reader
/// (`TokenStore.start(reporting:current:)`), and the reports waiting for them, delivered in the
/// order they were decided with no lock held (docs/architecture.md, "Locks").
///
/// The owner delivers a change to its subscribers inside its report closure, and a delivery
/// resumes the engine's connections: nothing may hold a lock across it. So a decision is only
/// queued here (`enqueue`, under the link machine's lock, which keeps the queue in the order of
/// the decisions), and the thread that made it delivers after releasing every lock (`deliver`).
/// One thread delivers at a time: a thread that finds another delivering leaves its reports to
/// it, and the delivering thread takes batches until none is left, so the owner and the log hear
/// of every decision in order, as swift-async-algorithms' state machines hand their actions out
/// to be run after unlocking. Only the store's own threads (the writer, the subscription, the
/// sentinel watcher) deliver; request threads never queue a report.
///
/// Thread-safety: all members may be called from any thread. Its one lock (`state`) takes no
/// other and is never held while calling out; it nests inside the link machine's lock.
final class RedisOwnerReports: Sendable {
    /// One report: to the owner, or a log line (kept in order with the owner's).
    enum Report: Sendable {
        /// A `TokenStoreEvent` for the owner's report closure.
        case owner(TokenStoreEvent)
        /// A log line.
        case log(ServerLogLevel, String)
    }

    /// What the lock guards.
    private struct State: Sendable {
        /// Reports decided and not delivered yet, oldest first.
        var waiting: [Report] = []
        /// Whether a thread is delivering (it takes `waiting` until it is empty).
        var delivering = false
        /// The owner's report closure (in a class box: see `ClosureBox`).
        var report: ClosureBox<@Sendable (TokenStoreEvent) -> Void>?
        /// Reads the owner's state (in a class box: see `ClosureBox`).
        var current: ClosureBox<@Sendable () -> TokenState>?
    }

    private let state = Locked(State())
    private let logger: @Sendable (ServerLogLevel, String) -> Void

    /// Reports to no owner (until `start`), logging through `log`.
    init(log: @escaping @Sendable (ServerLogLevel, String) -> Void) {
        self.logger = log
    }

    /// Starts sending the owner what the store learns, reading the owner's state with `current`.
    func start(
        reporting report: @escaping @Sendable (TokenStoreEvent) -> Void,
        current: @escaping @Sendable () -> TokenState
    ) {
        state.withLock {
            $0.report = ClosureBox(report)
            $0.current = ClosureBox(current)
        }
    }

    /// The owner's state now (`.initial` before `start`): in replica mode every state the owner
    /// has came from this store, so it is the replica's state. No copy is kept. Reads the owner's
    /// lock: call it with no lock of the store held.
    var ownerState: TokenState {
        state.withLock { $0.current }?.closure() ?? .initial
    }

    /// Queues `reports` for `deliver()`, in order. Called under the link machine's lock (so the
    /// queue keeps the order of the machine's decisions); takes only this type's lock.
    func enqueue(_ reports: [Report]) {
        state.withLock { $0.waiting.append(contentsOf: reports) }
    }

    /// Queues `report` and delivers: for a decision not made by the link's machine (a state a
    /// check read). Call with no lock held.
    func send(_ report: Report) {
        state.withLock { $0.waiting.append(report) }
        deliver()
    }

    /// Delivers what is queued, in order, unless another thread is delivering (it delivers this
    /// thread's reports too). Call with no lock held: the owner's report closure delivers to
    /// subscribers.
    func deliver() {
        typealias Reporter = ClosureBox<@Sendable (TokenStoreEvent) -> Void>
        var delivering = false
        while true {
            let (batch, report) = state.withLock { state -> ([Report], Reporter?) in
                // Another thread is delivering: it takes what this one queued.
                if !delivering && state.delivering { return ([], nil) }
                if state.waiting.isEmpty {
                    if delivering { state.delivering = false }
                    return ([], nil)
                }
                state.delivering = true
                defer { state.waiting = [] }
                return (state.waiting, state.report)
            }
            if batch.isEmpty { return }
            delivering = true
            for item in batch {
                switch item {
                case .owner(let event): report?.closure(event)
                case .log(let level, let line): logger(level, line)
                }
            }
        }
    }
}

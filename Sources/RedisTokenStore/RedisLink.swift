import Dispatch
import ForgePushToken
import ForgePushTokenOwner
import ServerSupport

/// What the writer and the subscription share: the link's health (`RedisLinkStateMachine`),
/// driven here, and the parts with a job each: the one place that connects to Redis
/// (`RedisConnector`), the queue of work for the writer (`RedisJobQueue`), the way to the owner
/// (`RedisOwnerReports`), and the metrics and limited log lines (`RedisTelemetry`). Events go through the machine under its lock; the actions it
/// returns are carried out after releasing it: health reports to the owner and log lines are
/// queued (under the machine's lock, in the order decided) and delivered by `RedisOwnerReports`
/// with no lock held; checks are queued on the writer; those for the subscription alone (`ping`,
/// `reconnect`) are handed back.
///
/// Thread-safety: all members may be called from any thread. Locks: the machine's, with the
/// reports' queue nested inside it (`RedisOwnerReports.enqueue`); the telemetry's; the job queue's.
/// None is held while calling out: the owner's report closure and state reader run with no lock
/// of the store held (docs/architecture.md, "Locks").
final class RedisLink: Sendable {
    /// Settings of the store.
    let configuration: RedisTokenStore.Configuration
    /// This store's id in the `"writer"` field of the messages its scripts publish: up to 16 random
    /// hex digits, new for every process.
    let writerID: String
    /// The work queue of the writer.
    let queue: RedisJobQueue
    /// The writes' deadlines: each write is answered within the write timeout of being queued.
    let deadlines: RedisWriteDeadlines
    /// The way to the owner, and the queue of reports and log lines the machine decided.
    private let reports: RedisOwnerReports
    /// Makes every connection to Redis and the sentinels, with the TLS credentials.
    let connector: RedisConnector
    private let machine: Locked<RedisLinkStateMachine>
    /// The store's counters, histograms and limited log lines.
    let telemetry: RedisTelemetry

    /// A link for `configuration`, logging through `log`.
    init(
        configuration: RedisTokenStore.Configuration,
        log: @escaping @Sendable (ServerLogLevel, String) -> Void
    ) {
        self.configuration = configuration
        self.deadlines = RedisWriteDeadlines(clock: configuration.clock)
        self.telemetry = RedisTelemetry(log: log)
        self.reports = RedisOwnerReports(log: log)
        self.queue = RedisJobQueue(capacity: configuration.queueCapacity)
        self.writerID = String(UInt64.random(in: 0...UInt64.max), radix: 16)
        self.connector = RedisConnector(configuration: configuration)
        self.machine = Locked(
            RedisLinkStateMachine(
                endpoint: configuration.endpoint.description, prefix: configuration.prefix.value,
                timings: configuration.timings))
    }

    /// Starts sending the owner what this store learns, reading the owner's state with `current`.
    func start(
        reporting report: @escaping @Sendable (TokenStoreEvent) -> Void,
        current: @escaping @Sendable () -> TokenState
    ) {
        reports.start(reporting: report, current: current)
    }

    /// Whether the store is stopping.
    var isStopping: Bool { queue.isStopped }

    /// Runs the write deadlines (`RedisWriteDeadlines.run`) on the calling thread until the store
    /// stops; a write answered at its deadline asks for a check of `PREFIX:state` (it may still be
    /// applied, and this replica skips its own change messages).
    func runDeadlines() {
        deadlines.run { [self] in handle { $0.refreshRequested(at: now()) } }
    }

    /// Marks the store as stopping and wakes the writer.
    func stop() {
        queue.stop()
        deadlines.stop()
    }

    // MARK: Events

    /// Runs `event` through the link's machine and carries out its actions; returns those for the
    /// subscription (`ping`, `reconnect`). Reports to the owner and log lines are queued under the
    /// machine's lock, in the order decided, and delivered after it is released
    /// (`RedisOwnerReports.deliver`): no lock is held while the owner delivers to subscribers.
    @discardableResult
    func handle(_ event: (inout RedisLinkStateMachine) -> [RedisLinkStateMachine.Action])
        -> [RedisLinkStateMachine.Action]
    {
        var rest: [RedisLinkStateMachine.Action] = []
        var checks = 0
        var probes: [UInt64] = []
        var ignoredMessages: [(RedisIgnoredMessage, String)] = []
        let queued = machine.withLock { machine -> Bool in
            var decided: [RedisOwnerReports.Report] = []
            for action in event(&machine) {
                switch action {
                case .report(let health): decided.append(.owner(.health(health)))
                case .log(let level, let line): decided.append(.log(level, line))
                case .requestCheck: checks += 1
                case .probe(let sequence): probes.append(sequence)
                case .ignored(let kind, let detail): ignoredMessages.append((kind, detail))
                case .ping, .reconnect, .resubscribe: rest.append(action)
                }
            }
            if decided.isEmpty { return false }
            reports.enqueue(decided)
            return true
        }
        if queued { reports.deliver() }
        for (kind, detail) in ignoredMessages { telemetry.ignored(kind, detail) }
        // A check refused by a full queue runs the machine again.
        for _ in 0..<checks where !queue.push(.check) {
            machine.withLock { $0.checkNotQueued() }
        }
        for sequence in probes where !queue.push(.probe(sequence: sequence)) {
            machine.withLock { $0.probeNotSent(sequence: sequence) }
        }
        return rest
    }

    /// Runs an event that never reports to the owner (`refreshRequested`: it only asks for a
    /// check): request threads (libmicrohttpd's) call it, and never deliver the owner's reports
    /// (a delivery resumes libmicrohttpd connections: it belongs to the store's threads).
    func request(_ event: (inout RedisLinkStateMachine) -> [RedisLinkStateMachine.Action]) {
        let actions = machine.withLock { event(&$0) }
        for action in actions {
            switch action {
            case .requestCheck:
                if !queue.push(.check) { machine.withLock { $0.checkNotQueued() } }
            case .log(let level, let line):
                telemetry.log(level, line)
            case .ignored(let kind, let detail):
                telemetry.ignored(kind, detail)
            case .report, .ping, .reconnect, .probe, .resubscribe:
                // Not an outcome of these events (see `RedisLinkStateMachine.refreshRequested`).
                break
            }
        }
    }

    /// Now on the link's clock (`Configuration.clock`), in `monotonicSeconds()`'s seconds: the time
    /// every event of the machine and every write's deadline is given.
    func now() -> Double { monotonicSeconds(on: configuration.clock) }

    /// Runs `event`, which returns nothing, through the machine.
    func note(_ event: (inout RedisLinkStateMachine) -> Void) {
        machine.withLock { event(&$0) }
    }

    /// How long the subscription may wait for its next message before the probe needs a tick, in
    /// whole milliseconds: 1 to `longest` (`RedisLinkStateMachine.secondsUntilProbeDue`, rounded
    /// up and one past, since the probe's timeout is a strict "more than").
    func pollMilliseconds(longest: Int) -> Int {
        guard let due = machine.withLock({ $0.secondsUntilProbeDue(at: now()) }) else { return longest }
        let seconds = min(max(due, 0), Double(longest) / 1000)
        return min(longest, Int((seconds * 1000).rounded(.up)) + 1)
    }

    /// Whether a write is refused at once (Redis known to be down), and the reason.
    var refusal: RedisLinkStateMachine.Health? {
        machine.withLock { $0.refusesWrites ? $0.health : nil }
    }

    /// The link's health.
    var health: RedisLinkStateMachine.Health { machine.withLock { $0.health } }

    // MARK: States

    /// The replica's state (the owner's) once a state was read from Redis, `nil` before: what
    /// the scripts write back when Redis lost its data.
    var replicaState: TokenState? {
        guard machine.withLock({ $0.stateRead }) else { return nil }
        return reports.ownerState
    }

    /// Another replica's change message announced `state`: a notification, never a state (docs/
    /// replicas.md, "What a replica trusts"). When it is above the replica's version, the writer
    /// reads `PREFIX:state` (`RedisLinkStateMachine.changeAnnounced`), and what the replica learns
    /// is what that read returns.
    func announced(_ state: TokenState) {
        guard state.version > reports.ownerState.version else { return }
        handle { $0.changeAnnounced(state) }
    }

    /// `state` was read from `PREFIX:state` (a check): the owner hears of it when it is newer than
    /// the owner's state, in order with the link's health reports, with no lock held. Two reads of
    /// one state may both find it newer (no lock spans the comparison and the report): the owner
    /// applies a version once and ignores it after (`TokenOwnerStateMachine`: versions never go
    /// back), so it reaches subscribers once. Nothing else reaches the owner from Redis but its own
    /// commits' outcomes.
    func learned(_ state: TokenState) {
        guard state.version > reports.ownerState.version else { return }
        reports.send(.owner(.changed(state)))
    }

    /// This store's own commit came back from Redis: the owner applies its outcome from the
    /// commit's completion (not reported here); the link now knows a state.
    func committed() {
        handle { $0.stateLearned() }
    }

    // MARK: Metrics

    /// This replica's probe number `sequence` was heard on the subscription: its round trip goes
    /// into the histogram, and a link that was not delivering is connected again.
    func probeHeard(sequence: UInt64) {
        var seconds: Double?
        handle { machine in
            let heard = machine.probeHeard(sequence: sequence, at: now())
            seconds = heard.seconds
            return heard.actions
        }
        if let seconds { telemetry.recordProbe(seconds: seconds) }
    }

    /// The store's series (`RedisMetrics.series`), with the link's health and the master in use.
    func series() -> [StoreMetric] {
        telemetry.series(up: health == .connected, directory: connector.directory)
    }
}

/// A closure in a class box, for keeping one in a `Locked`. `Locked` holds its state in its most
/// general (generic) form, and a closure read through `withLock`'s `inout` is converted to its
/// concrete form and written back converted again: each access wrapped it in two more
/// reabstraction thunks, so every write through Redis called a chain of thunks one link longer
/// than the last (a `perf` profile of a replica under writes: 93 % of its CPU in such thunks, and
/// POST /register fell from about 14,000 to 4,600 requests a second). A class reference has one
/// form, so the box is read as it was stored.
///
/// Thread-safety: immutable; `Sendable` as its closure is.
final class ClosureBox<Closure: Sendable>: Sendable {
    /// The closure.
    let closure: Closure

    /// Boxes `closure`.
    init(_ closure: Closure) {
        self.closure = closure
    }
}

import Dispatch
import ForgePushToken
import ForgePushTokenOwner
import GnuTLSClient
import ServiceLogging

/// What the writer and the subscription share: the one place that connects to Redis, the link's
/// health (`RedisLinkStateMachine`), the metrics, the queue of work for the writer, and the way to
/// the owner (its report closure, and a reader of its state: no copy is kept). Events go through the machine under its lock; the actions it
/// returns are carried out after (health reports to the owner, log lines, checks queued on the
/// writer), and those for the subscription alone (`ping`, `reconnect`) are handed back.
///
/// Thread-safety: all members may be called from any thread. Lock order: `reports`, then the
/// machine's, the metrics' or a closure slot's lock (each alone, none held while calling out);
/// the owner's lock nests inside `reports` (the owner's report closure and state reader run under
/// it, so that the owner hears of changes and health in the order they were decided).
final class RedisLink: Sendable {
    /// Settings of the store.
    let configuration: RedisTokenStore.Configuration
    /// This store's id in the `"writer"` field of the messages its scripts publish: up to 16 random
    /// hex digits, new for every process.
    let writerID: String
    /// The work queue of the writer.
    let queue: RedisJobQueue
    private let logger: @Sendable (ServerLogLevel, String) -> Void
    /// The TLS credentials of a `rediss://` endpoint, loaded once (`nil` for other endpoints).
    private let credentials: Result<TLSClientCredentials, TLSError>?
    private let machine: Locked<RedisLinkStateMachine>
    private let metrics = Locked(RedisMetrics())
    /// Reads the owner's state (`TokenStore.start(reporting:current:)`): in replica mode every
    /// state the owner has came from this store, so it is the replica's state. No copy is kept.
    /// (Both closures are kept in class boxes: see `ClosureBox`.)
    private let ownerState = Locked<ClosureBox<@Sendable () -> TokenState>?>(nil)
    private let reporter = Locked<ClosureBox<@Sendable (TokenStoreEvent) -> Void>?>(nil)
    /// Serialises the decisions that end in a report (see the type's lock order); counts them (a
    /// lock over a zero-sized value makes Thread Sanitizer see the mutex itself as the value
    /// accessed).
    private let reports = Locked<UInt64>(0)

    /// A link for `configuration`, logging through `log`.
    init(
        configuration: RedisTokenStore.Configuration,
        log: @escaping @Sendable (ServerLogLevel, String) -> Void
    ) {
        self.configuration = configuration
        self.logger = log
        self.queue = RedisJobQueue(capacity: configuration.queueCapacity)
        self.writerID = String(UInt64.random(in: 0...UInt64.max), radix: 16)
        if configuration.endpoint.tls {
            do throws(TLSError) {
                credentials = .success(try configuration.tls.credentials())
            } catch {
                credentials = .failure(error)
            }
        } else {
            credentials = nil
        }
        directory = configuration.endpoint.sentinel.map(RedisSentinelDirectory.init)
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
        ownerState.withLock { $0 = ClosureBox(current) }
        reporter.withLock { $0 = ClosureBox(report) }
    }

    /// Whether the store is stopping.
    var isStopping: Bool { queue.isStopped }

    /// Marks the store as stopping and wakes the writer.
    func stop() {
        queue.stop()
    }

    /// With a sentinel URL, the sentinels and the master in use; `nil` otherwise.
    let directory: RedisSentinelDirectory?

    /// The one place that connects to Redis: connect (and the TLS handshake for `rediss://`),
    /// `AUTH`, `SELECT`, bounded by the write timeout (docs/replicas.md, "Starting it"). With a
    /// sentinel URL, the master is the address a majority of the sentinels vouch for, checked
    /// with `ROLE` (`RedisSentinelDirectory`); the connection remembers the directory's generation, so that
    /// a `+switch-master` makes its owner leave it (`hasMoved`).
    func connect() throws(RedisConnectionError) -> RedisConnection {
        let loaded = try tlsCredentials()
        guard let directory else {
            return try RedisConnection(
                endpoint: configuration.endpoint, timeout: configuration.writeTimeout, credentials: loaded)
        }
        let generation = directory.generation
        let master = try directory.findMaster(like: configuration.endpoint, credentials: loaded)
        var endpoint = configuration.endpoint
        endpoint.address = .tcp(host: master.host, port: master.port)
        endpoint.sentinel = nil
        let connection: RedisConnection
        do throws(RedisConnectionError) {
            connection = try RedisConnection(
                endpoint: endpoint, timeout: configuration.writeTimeout, credentials: loaded)
            try directory.checkRole(of: connection, at: master, timeout: configuration.writeTimeout)
        } catch {
            // Ask the sentinels' majority again next time.
            directory.forget(master)
            throw error
        }
        directory.using(master)
        connection.generation = generation
        return connection
    }

    /// A connection to the sentinel at `host` (its password, no database).
    func connectSentinel(_ host: RedisEndpoint.Host) throws(RedisConnectionError) -> RedisConnection {
        guard let directory else { throw .sentinelsUnreachable("no sentinel URL") }
        return try RedisConnection(
            endpoint: directory.endpoint(of: host, like: configuration.endpoint), timeout: configuration.writeTimeout,
            credentials: try tlsCredentials(), select: false)
    }

    /// Whether `host` (a replica the sentinels' majority lists) answers `ROLE` as a master now,
    /// asked on a connection of its own with the master's credentials, within 500 ms.
    func isMaster(_ host: RedisEndpoint.Host) -> Bool {
        guard let directory else { return false }
        var endpoint = configuration.endpoint
        endpoint.address = .tcp(host: host.host, port: host.port)
        endpoint.sentinel = nil
        do throws(RedisConnectionError) {
            let timeout = RedisSentinelDirectory.decisionSeconds
            let connection = try RedisConnection(
                endpoint: endpoint, timeout: timeout, credentials: try tlsCredentials())
            try directory.checkRole(of: connection, at: host, timeout: timeout)
            return true
        } catch {
            return false
        }
    }

    /// What a majority of the sentinels say now (`RedisSentinelDirectory.vouch`).
    /// - Throws: as `vouch`; `.sentinelsUnreachable` without a sentinel URL.
    func vouch() throws(RedisConnectionError) -> RedisSentinelDirectory.Agreement {
        guard let directory else { throw .sentinelsUnreachable("no sentinel URL") }
        return try directory.vouch(like: configuration.endpoint, credentials: try tlsCredentials())
    }

    /// Whether the sentinels announced a new master since `connection` was made.
    func hasMoved(_ connection: RedisConnection) -> Bool {
        guard let directory else { return false }
        return directory.generation != connection.generation
    }

    private func tlsCredentials() throws(RedisConnectionError) -> TLSClientCredentials? {
        switch credentials {
        case .failure(let error): throw .tlsFailed(error.description)
        case .success(let loaded): return loaded
        case nil: return nil
        }
    }

    // MARK: Events

    /// Runs `event` through the link's machine and carries out its actions; returns those for the
    /// subscription (`ping`, `reconnect`).
    @discardableResult
    func handle(_ event: (inout RedisLinkStateMachine) -> [RedisLinkStateMachine.Action])
        -> [RedisLinkStateMachine.Action]
    {
        var rest: [RedisLinkStateMachine.Action] = []
        var checks = 0
        var probes: [UInt64] = []
        reports.withLock { count in
            count &+= 1
            let actions = machine.withLock { event(&$0) }
            let report = reporter.withLock { $0 }?.closure
            for action in actions {
                switch action {
                case .report(let health): report?(.health(health))
                case .log(let level, let line): logger(level, line)
                case .requestCheck: checks += 1
                case .probe(let sequence): probes.append(sequence)
                case .ignored(let kind, let detail): ignored(kind, detail)
                case .ping, .reconnect, .resubscribe: rest.append(action)
                }
            }
        }
        // Outside `reports`: a check refused by a full queue runs the machine again.
        for _ in 0..<checks where !queue.push(.check) {
            machine.withLock { $0.checkNotQueued() }
        }
        for sequence in probes where !queue.push(.probe(sequence: sequence)) {
            machine.withLock { $0.probeNotSent(sequence: sequence) }
        }
        return rest
    }

    /// Runs an event that never reports to the owner (`refreshRequested`: it only asks for a
    /// check) without taking `reports`: request threads (libmicrohttpd's) call it, and must never
    /// wait while a store thread delivers a change to subscribers under `reports` (a delivery
    /// resumes libmicrohttpd connections).
    func request(_ event: (inout RedisLinkStateMachine) -> [RedisLinkStateMachine.Action]) {
        let actions = machine.withLock { event(&$0) }
        for action in actions {
            switch action {
            case .requestCheck:
                if !queue.push(.check) { machine.withLock { $0.checkNotQueued() } }
            case .log(let level, let line):
                logger(level, line)
            case .ignored(let kind, let detail):
                ignored(kind, detail)
            case .report, .ping, .reconnect, .probe, .resubscribe:
                // Not an outcome of these events (see `RedisLinkStateMachine.refreshRequested`).
                break
            }
        }
    }

    /// Runs `event`, which returns nothing, through the machine.
    func note(_ event: (inout RedisLinkStateMachine) -> Void) {
        machine.withLock { event(&$0) }
    }

    /// How long the subscription may wait for its next message before the probe needs a tick, in
    /// whole milliseconds: 1 to `longest` (`RedisLinkStateMachine.secondsUntilProbeDue`, rounded
    /// up and one past, since the probe's timeout is a strict "more than").
    func pollMilliseconds(longest: Int) -> Int {
        guard let due = machine.withLock({ $0.secondsUntilProbeDue(at: monotonicSeconds()) }) else { return longest }
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
        return ownerState.withLock { $0 }?.closure()
    }

    /// Another replica's change message announced `state`: a notification, never a state (docs/
    /// replicas.md, "What a replica trusts"). When it is above the replica's version, the writer
    /// reads `PREFIX:state` (`RedisLinkStateMachine.changeAnnounced`), and what the replica learns
    /// is what that read returns.
    func announced(_ state: TokenState) {
        let ownerVersion = ownerState.withLock { $0 }?.closure().version ?? 0
        guard state.version > ownerVersion else { return }
        handle { $0.changeAnnounced(state) }
    }

    /// `state` was read from `PREFIX:state` (a check): the owner hears of it once, and only when it
    /// is newer than the owner's state (under `reports`, so that two reads of one state do not both
    /// find it newer). Nothing else reaches the owner from Redis but its own commits' outcomes.
    func learned(_ state: TokenState) {
        reports.withLock { _ in
            let ownerVersion = ownerState.withLock { $0 }?.closure().version ?? 0
            guard state.version > ownerVersion else { return }
            reporter.withLock { $0 }?.closure(.changed(state))
        }
    }

    /// This store's own commit came back from Redis: the owner applies its outcome from the
    /// commit's completion (not reported here); the link now knows a state.
    func committed() {
        handle { $0.stateLearned() }
    }

    // MARK: Metrics and logs

    /// Counts a failed connect, command or wait.
    func countError() { metrics.withLock { $0.countError() } }

    /// Counts a subscription made again.
    func countReconnect() { metrics.withLock { $0.countReconnect() } }

    /// Records a commit's round trip.
    func recordWrite(seconds: Double) { metrics.withLock { $0.recordWrite(seconds: seconds) } }

    /// This replica's probe number `sequence` was heard on the subscription: its round trip goes
    /// into the histogram, and a link that was not delivering is connected again.
    func probeHeard(sequence: UInt64) {
        var seconds: Double?
        handle { machine in
            let heard = machine.probeHeard(sequence: sequence, at: monotonicSeconds())
            seconds = heard.seconds
            return heard.actions
        }
        if let seconds { metrics.withLock { $0.recordProbe(seconds: seconds) } }
    }

    /// The metrics text (`RedisMetrics.render`).
    func renderMetrics() -> String {
        let up = health == .connected
        let master = directory?.master
        return metrics.withLock { $0 }.render(
            up: up, masterChanges: master?.changes ?? 0, sentinel: directory != nil,
            master: master?.host?.description)
    }

    /// Writes a log line.
    func log(_ level: ServerLogLevel, _ line: String) { logger(level, line) }

    /// A message of `kind` from Redis or a sentinel changed nothing: counts it, and logs `detail`
    /// as a warning at most once per 10 s per kind (`RedisLogLimiter`).
    func ignored(_ kind: RedisIgnoredMessage, _ detail: String) {
        let leftOut = metrics.withLock { metrics -> UInt64? in
            metrics.countIgnored(kind)
            return metrics.limiter.admit("ignored." + kind.rawValue, at: monotonicSeconds())
        }
        if let leftOut { logger(.warning, RedisLogLimiter.annotate(detail, leftOut: leftOut)) }
    }

    /// Logs `line` at most once per 10 s for `key` (a line that Redis traffic causes, such as a
    /// `+switch-master`), with how many were left out.
    func logLimited(_ key: String, _ level: ServerLogLevel, _ line: String) {
        let leftOut = metrics.withLock { $0.limiter.admit(key, at: monotonicSeconds()) }
        if let leftOut { logger(level, RedisLogLimiter.annotate(line, leftOut: leftOut)) }
    }
}

/// The writer's bounded queue of work: commits and checks of `PREFIX:state`.
///
/// Thread-safety: all members may be called from any thread; `take` from the writer's alone.
final class RedisJobQueue: Sendable {
    /// One piece of work.
    enum Job: Sendable {
        /// Propose `token`; `enqueued` in monotonic seconds; `completion` gets the outcome.
        case change(token: String?, enqueued: Double, completion: @Sendable (CommitOutcome) -> Void)
        /// Read and reconcile `PREFIX:state`.
        case check
        /// Publish delivery probe number `sequence` on `PREFIX:probe`.
        case probe(sequence: UInt64)
    }

    private let capacity: Int
    /// The jobs, and whether the queue was stopped (one lock, so that no job is queued after the
    /// writer saw the queue stopped and empty).
    private let state = Locked<(jobs: [Job], stopped: Bool)>(([], false))
    /// Signalled once per job queued (and at stop): the writer waits on it when the queue is
    /// empty. (Dispatch, not Foundation's NSCondition: the server links no full Foundation.)
    private let signal = DispatchSemaphore(value: 0)

    /// A queue of at most `capacity` jobs.
    init(capacity: Int) {
        self.capacity = capacity
    }

    /// Queues `job`; `false` when the queue is full or stopped.
    func push(_ job: Job) -> Bool {
        let accepted = state.withLock { state -> Bool in
            guard !state.stopped, state.jobs.count < capacity else { return false }
            state.jobs.append(job)
            return true
        }
        if accepted { signal.signal() }
        return accepted
    }

    /// Up to 64 jobs, waiting for one; `nil` once stopped and empty. After `stop()` what is left
    /// is still handed out (to be failed), and `stopped` says so.
    func take() -> (jobs: [Job], stopped: Bool)? {
        while true {
            let (batch, stopped) = state.withLock { state -> ([Job], Bool) in
                let taken = Array(state.jobs.prefix(64))
                state.jobs.removeFirst(taken.count)
                return (taken, state.stopped)
            }
            if !batch.isEmpty { return (batch, stopped) }
            if stopped { return nil }
            // Extra signals (one per job already taken in a batch) only cause an empty round.
            _ = signal.wait(timeout: .now() + .milliseconds(500))
        }
    }

    /// Whether `stop()` was called.
    var isStopped: Bool { state.withLock { $0.stopped } }

    /// Refuses further jobs and wakes the writer.
    func stop() {
        state.withLock { $0.stopped = true }
        signal.signal()
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

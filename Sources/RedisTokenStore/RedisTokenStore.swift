import Dispatch
import ForgePushToken
import ForgePushTokenOwner
import ServerSupport

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// The `TokenStore` that replicas of the service share: the token lives in Redis
/// (docs/replicas.md), as the hash `PREFIX:state` with the channel `PREFIX:changes`
/// (`RedisCodec`), and Redis decides every write atomically in a Lua script (`RedisScripts`), so
/// commits are `.storeSerialized` and the owner's `base` is not needed.
///
/// It is made of parts with one job each, over one connection type (`RedisConnection`, made in
/// one place, `RedisConnector.connect()`):
/// - `RedisWriter`, a thread that runs commits and checks of `PREFIX:state` as pipelined batches
///   from a bounded queue (full: the commit fails at once);
/// - `RedisSubscription`, a thread subscribed to `PREFIX:changes`;
/// - with a sentinel URL, `RedisSentinelDirectory` (finding the master) and
///   `RedisSentinelWatcher`, a thread subscribed to the sentinels' `+switch-master`;
/// - `RedisLinkStateMachine`, the link's health, log lines, checks, pings and reconnects, as a
///   value, driven by `RedisLink`;
/// - `RedisJobQueue`, the writer's bounded queue;
/// - `RedisWriteDeadlines`, a thread that answers a write `.unknown` at the write timeout after it
///   was queued when the writer has not answered it (the queue, a reconnect and `SCRIPT LOAD`
///   count in the 2 s);
/// - `RedisOwnerReports`, the way to the owner: reports queued in the order decided and delivered
///   with no lock held;
/// - `RedisMetrics`, the store's series in `/metrics`.
///
/// A change reaches the owner once: the outcome of this replica's write through the commit's
/// completion; a state a check read (after another replica's change message announced it) as
/// `TokenStoreEvent.changed`, and only when it is newer than the owner's state (this store keeps
/// no copy of its own; its own messages are recognised by their `"writer"` field and skipped; two
/// reads of one state may both report it, and the owner applies a version once).
/// Outcomes: changed → `.applied`, not changed → `.unchanged` (both with the state Redis holds,
/// which may be newer than the replica's), no reply within the write timeout → `.unknown`, not
/// asked or refused → `.unavailable` (`Redis: <reason>`). Health: `RedisLinkStateMachine`.
///
/// Request threads only enqueue; they never wait for Redis or a reconnect. Logs (through `log`):
/// Redis lost (warning, once per outage), Redis back (info, with how long it was gone), state
/// written back after a data loss (warning, with both versions), an invalid `PREFIX:state`
/// (error, with how to repair it). The password is never logged.
///
/// Thread-safety: all members may be called from any thread. Completions and reports run on the
/// store's threads (or, for a commit refused at once, on the caller's); they must not block.
public final class RedisTokenStore: TokenStore {
    /// Settings of the store.
    public struct Configuration: Sendable, Equatable {
        /// Where Redis is.
        public var endpoint: RedisEndpoint
        /// The key namespace.
        public var prefix: RedisKeyPrefix
        /// Seconds a write (or a connect) may take before it counts as failed (2 s,
        /// docs/replicas.md).
        public var writeTimeout: Double = 2
        /// Pending commits and checks the writer queue holds before refusing more.
        public var queueCapacity: Int = 4096
        /// The link's timings; their defaults are written once, in `RedisLinkStateMachine.Timings`.
        var timings = RedisLinkStateMachine.Timings()
        /// Seconds between `PING`s on the subscription connection (1).
        public var heartbeatInterval: Double {
            get { timings.heartbeatInterval }
            set { timings.heartbeatInterval = newValue }
        }
        /// Seconds without an answer to a `PING` after which Redis counts as unreachable (3).
        public var heartbeatTimeout: Double {
            get { timings.heartbeatTimeout }
            set { timings.heartbeatTimeout = newValue }
        }
        /// Seconds between periodic checks of `PREFIX:state` (2).
        public var checkInterval: Double {
            get { timings.checkInterval }
            set { timings.checkInterval = newValue }
        }
        /// The least seconds between two checks asked for by `refresh()` (0.1).
        public var refreshInterval: Double {
            get { timings.refreshInterval }
            set { timings.refreshInterval = newValue }
        }
        /// Seconds between delivery probes on `PREFIX:probe` (`--redis-probe-interval`: whole
        /// seconds, 1 to 60, default 5); a probe not heard within 2 s is `not_delivering`.
        public var probeInterval: Double {
            get { timings.probeInterval }
            set { timings.probeInterval = newValue }
        }
        /// What a `rediss://` endpoint trusts and presents (unused by other endpoints): the system's
        /// trust store and no client certificate by default.
        public var tls = RedisTLSSettings()
        /// The clock of the link's decisions (`ServerClock`): each write's deadline
        /// (`RedisWriteDeadlines`), the pace of refreshes and checks, the heartbeat's and the
        /// delivery probe's timeouts (`RedisLinkStateMachine`'s times). Default `.monotonic`; tests
        /// give a manual one. The bounds of each socket read and connect, and the sentinels' and
        /// reconnection's pauses, stay on real time (`monotonicSeconds()`): they bound a wait in
        /// poll(2), not a decision.
        public var clock: ServerClock = .monotonic

        /// Creates a configuration with the contract's timings.
        public init(endpoint: RedisEndpoint, prefix: RedisKeyPrefix = .standard) {
            self.endpoint = endpoint
            self.prefix = prefix
        }
    }

    /// The configuration the store runs with.
    public var configuration: RedisTokenStore.Configuration { link.configuration }
    /// What the parts share (internal, not private: the tests read the link's own health).
    let link: RedisLink
    private let writer: RedisWriter
    private let subscription: RedisSubscription
    /// With a sentinel URL, the subscription to the sentinels' `+switch-master`.
    private let watcher: RedisSentinelWatcher?
    private let threads = DispatchGroup()

    /// The owner's health before the store reported anything: `.starting`, `unreachable` (the
    /// replica knows no token until it read the state).
    public static let healthAtStart = RedisLinkStateMachine.healthAtStart

    /// Creates a store; nothing connects until `start(reporting:current:)`.
    public init(
        configuration: Configuration,
        log: @escaping @Sendable (ServerLogLevel, String) -> Void
    ) {
        let link = RedisLink(configuration: configuration, log: log)
        self.link = link
        writer = RedisWriter(link: link)
        subscription = RedisSubscription(link: link)
        watcher = link.connector.directory.map { RedisSentinelWatcher(link: link, directory: $0) }
    }

    /// `.storeSerialized`: Redis decides every commit atomically, and commits may overlap.
    public var ordering: CommitOrdering { .storeSerialized }

    /// Proposes `token` (`nil`: no token) through the change script; `base` is ignored (Redis
    /// decides against the state it holds). `completion` runs once, on the writer thread after
    /// Redis answered or failed, or on the deadline thread at the write timeout after this call,
    /// whichever comes first. Returned at once (`.unavailable`), and `completion` never called,
    /// when Redis is known to be down (`RedisLinkStateMachine.refusesWrites`), the queue is full
    /// or the store is stopping: a request does not wait for a Redis known to be down.
    public func commit(_ token: String?, base: TokenState, completion: @escaping @Sendable (CommitOutcome) -> Void)
        -> CommitOutcome?
    {
        if let health = link.refusal {
            return .unavailable(reason: health.unavailableReason)
        }
        let answer = RedisWriteAnswer(
            enqueued: link.now(), timeout: configuration.writeTimeout, completion: completion)
        if !link.queue.push(.change(token: token, answer: answer)) {
            // Not queued, so nothing else gives this answer.
            let health = link.health
            return .unavailable(reason: (health == .connected ? .unreachable : health).unavailableReason)
        }
        // Tracked after it is queued: a write the queue refused is answered above.
        link.deadlines.track(answer)
        return nil
    }

    /// Starts the writer and subscription threads, reporting changes and health to the owner
    /// (whose state `current` reads: it is this replica's state, written back when Redis lost
    /// its data, and what a state read from Redis must be newer than to be reported), and sets `SIGPIPE` to be ignored by the process (hiredis writes with `write(2)`).
    public func start(
        reporting report: @escaping @Sendable (TokenStoreEvent) -> Void,
        current: @escaping @Sendable () -> TokenState
    ) {
        // hiredis writes with write(2), which raises SIGPIPE on a connection the server closed;
        // that must never end the process (forge-push-token-server ignores it already).
        signal(SIGPIPE, SIG_IGN)
        link.start(reporting: report, current: current)
        // Each loop blocks for its whole life on its own serial queue, so Dispatch gives each
        // a thread of its own (as the server's daemon loops do).
        var loops: [(String, @Sendable () -> Void)] = [
            ("forge-push-token.redis-writer", writer.run),
            ("forge-push-token.redis-deadlines", link.runDeadlines),
            ("forge-push-token.redis-subscriber", subscription.run),
        ]
        if let watcher { loops.append(("forge-push-token.redis-sentinel", watcher.run)) }
        for (name, body) in loops {
            threads.enter()
            DispatchQueue(label: name).async { [threads] in
                body()
                threads.leave()
            }
        }
    }

    /// Stops the threads (the writer, the write deadlines, the subscription, and with a sentinel
    /// URL the `+switch-master` watcher) and fails what is still queued with `.unavailable`; a
    /// write in flight is answered by its deadline at the latest. Nothing is written
    /// to Redis (a replica's shutdown never touches the state). Waits at most 1 s for the
    /// threads to end: one blocked in a connect or a read to a hung Redis ends when that times
    /// out, and the service's shutdown does not wait for it.
    public func stop() {
        stop(timeout: 1)
    }

    /// `stop()`, waiting at most `timeout` seconds for the threads.
    public func stop(timeout: Double) {
        link.stop()
        _ = threads.wait(timeout: .now() + timeout)
    }

    /// Reads `PREFIX:state` again soon: a subscriber's `Last-Event-ID` is above the replica's
    /// version. Coalesced: at most one check in flight, and at most one such check per
    /// `refreshInterval` (`RedisLinkStateMachine.refreshRequested`).
    public func refresh() {
        link.request { [link] in $0.refreshRequested(at: link.now()) }
    }

    /// Shared as `redis` (the HTTP layer's replica mode names the link's state so, docs/replicas.md),
    /// no durable copy of its own (Redis keeps it), and its series as `RedisMetrics` renders them.
    public func status() -> StoreStatus {
        StoreStatus(sharedName: "redis", series: link.series())
    }
}

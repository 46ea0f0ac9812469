import Dispatch
import ForgePushToken

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Keeps the token in Redis so that several replicas of the service share it (see
/// docs/replicas.md): the layout is `PREFIX:state` (a hash of `version` and `token`) and the
/// pub/sub channel `PREFIX:changes`.
///
/// Two background threads, each with its own connection:
/// - the writer takes commits and state checks from a bounded queue (full: the commit fails at
///   once with `.unavailable`), sends what is queued in one pipelined batch (`EVALSHA` of the
///   scripts in `RedisScripts`, `EVAL` again on `NOSCRIPT`) and waits at most `writeTimeout`
///   for the replies (no reply in time: `.unknown`, and the connection is made again);
/// - the subscriber subscribes to `PREFIX:changes`, then asks the writer for a state check (so a
///   change made while it was away is never missed), sends a `PING` every `heartbeatInterval`
///   and treats a Redis that does not answer within `heartbeatTimeout` as unreachable (a hung
///   Redis, stopped with `SIGSTOP`, is detected within 5 s), asks for a state check every
///   `checkInterval`, and reconnects by itself with `ReconnectBackoff`.
/// Request threads only enqueue; they never wait for Redis or a reconnect.
///
/// What arrives from Redis (a change message, a check's or a commit's result) is handed to the
/// `onState` callback of `start`, which must apply it only if it is newer than what the replica
/// has (versions only grow). Health changes go to `onHealth`.
///
/// Logs (through `log`): Redis lost (warning, once per outage), Redis back (info, with how long
/// it was gone), state written back after a data loss (warning, with both versions), an invalid
/// `PREFIX:state` (error, with how to repair it). The password is never logged.
///
/// Thread-safety: all members may be called from any thread. Callbacks run on the store's
/// threads (or, for a commit refused because the queue is full, on the caller's); they must not
/// block.
public final class RedisTokenStore: Sendable {
    /// Settings of the store.
    public struct Configuration: Sendable, Equatable {
        /// Where Redis is.
        public var endpoint: RedisEndpoint
        /// The key namespace.
        public var prefix: RedisKeyPrefix
        /// Seconds a write (or a connect) may take before it counts as failed (2 s, docs/replicas.md).
        public var writeTimeout: Double = 2
        /// Pending commits and checks the writer queue holds before refusing more.
        public var queueCapacity: Int = 4096
        /// Seconds between `PING`s on the subscription connection.
        public var heartbeatInterval: Double = 1
        /// Seconds without an answer to a `PING` after which Redis counts as unreachable.
        public var heartbeatTimeout: Double = 3
        /// Seconds between periodic checks of `PREFIX:state`.
        public var checkInterval: Double = 2

        /// Creates a configuration with the contract's timings.
        public init(endpoint: RedisEndpoint, prefix: RedisKeyPrefix = .standard) {
            self.endpoint = endpoint
            self.prefix = prefix
        }
    }

    /// The state of the link to Redis, as `/healthz` reports it (`redis` field).
    public enum Health: String, Sendable, Equatable {
        /// Subscribed and the state was read: `connected`.
        case connected
        /// Not connected (refused, timed out, hung, closed): `unreachable`.
        case unreachable
        /// Wrong password or user: `auth_failed`.
        case authFailed = "auth_failed"
        /// `PREFIX:state` holds something this service did not write: `invalid_state`.
        case invalidState = "invalid_state"
    }

    /// The outcome of a commit.
    public enum WriteOutcome: Sendable, Equatable {
        /// Redis confirmed it; `state` is the stored state after it (which may be newer than the
        /// replica's), `changed` whether this commit changed the token.
        case applied(SharedTokenState, changed: Bool)
        /// Redis was not asked or refused: nothing was written.
        case unavailable(Health)
        /// No answer in time: the write may or may not have been applied.
        case unknown
    }

    private enum Job: Sendable {
        case change(token: String?, enqueued: Double, completion: @Sendable (WriteOutcome) -> Void)
        case check(completion: (@Sendable (SharedTokenState?) -> Void)?)
    }

    private struct Callbacks: Sendable {
        var onState: @Sendable (SharedTokenState) -> Void
        var onHealth: @Sendable (Health, _ stateRead: Bool) -> Void
    }

    private struct Status: Sendable {
        var health: Health = .unreachable
        var subscribed = false
        var everConnected = false
        var lostAt: Double? = nil
        var lossLogged = false
        var checkPending = false
        /// Whether the writer's last attempt failed (connect, send, or no reply in time); cleared
        /// by the next reply.
        var writerFailed = false
        var stopping = false
        var callbacks: Callbacks? = nil
        /// The newest state learned from Redis (the replica's state: in this mode every state
        /// comes from the store), written back when Redis lost its data.
        var known: SharedTokenState? = nil
        var up = false
        var reconnects: UInt64 = 0
        var errors: UInt64 = 0
        var writeBuckets = [UInt64](repeating: 0, count: RedisTokenStore.writeBuckets.count)
        var writeCount: UInt64 = 0
        var writeSum: Double = 0
    }

    /// Upper bounds, in seconds, of the `forge_push_token_redis_write_seconds` buckets.
    public static let writeBuckets: [Double] = [
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5,
    ]

    /// The configuration the store runs with.
    public let configuration: Configuration
    private let log: @Sendable (PushTokenManager.LogLevel, String) -> Void
    private let status = Locked(Status())
    /// The writer queue.
    private let queue = Locked<[Job]>([])
    /// Signalled once per job enqueued (and at stop): the writer waits on it when the queue is
    /// empty. (Dispatch, not Foundation's NSCondition: the server links no full Foundation.)
    private let queueSignal = DispatchSemaphore(value: 0)
    private let threads = DispatchGroup()
    /// Serialises health reports, so that the owner receives them in the order they were decided
    /// (the writer and the subscriber both decide health). Only the owner's lock nests inside.
    private let healthReports = Locked<Void>(())

    /// Creates a store; nothing connects until `start`.
    public init(
        configuration: Configuration,
        log: @escaping @Sendable (PushTokenManager.LogLevel, String) -> Void
    ) {
        self.configuration = configuration
        self.log = log
    }

    /// Starts the writer and subscriber threads, and sets `SIGPIPE` to be ignored by the
    /// process (hiredis writes with `write(2)`).
    ///
    /// The store remembers the newest state it learned (the replica's state, since in this mode
    /// every state comes from Redis) and writes it back when Redis lost its data.
    /// - Parameters:
    ///   - onState: receives every state learned from Redis, possibly older than one given before
    ///     or repeated: apply it only if its version is higher.
    ///   - onHealth: receives every change of `health`, with whether the state has been read
    ///     from Redis at least once (before that the replica knows no token).
    public func start(
        onState: @escaping @Sendable (SharedTokenState) -> Void,
        onHealth: @escaping @Sendable (Health, _ stateRead: Bool) -> Void
    ) {
        // hiredis writes with write(2), which raises SIGPIPE on a connection the server closed;
        // that must never end the process (forge-push-token-server ignores it already).
        signal(SIGPIPE, SIG_IGN)
        status.withLock { $0.callbacks = Callbacks(onState: onState, onHealth: onHealth) }
        // Each loop blocks for its whole life on its own serial queue, so Dispatch gives each
        // a thread of its own (as the server's daemon loops do).
        for (name, body) in [
            ("forge-push-token.redis-writer", writerLoop),
            ("forge-push-token.redis-subscriber", subscriberLoop),
        ] as [(String, @Sendable () -> Void)] {
            threads.enter()
            DispatchQueue(label: name).async { [threads] in
                body()
                threads.leave()
            }
        }
    }

    /// Stops both threads and fails what is still queued with `.unavailable`. Nothing is written
    /// to Redis (a replica's shutdown never touches the state). Waits at most `timeout` seconds
    /// (1) for the threads to end: one blocked in a connect or a read to a hung Redis
    /// ends when that times out, and the service's shutdown does not wait for it.
    public func stop() {
        stop(timeout: 1)
    }

    /// `stop()`, waiting at most `timeout` seconds for the threads.
    public func stop(timeout: Double) {
        status.withLock { $0.stopping = true }
        queueSignal.signal()
        _ = threads.wait(timeout: .now() + timeout)
    }

    /// The current health.
    public var health: Health { status.withLock { $0.health } }

    /// Proposes `token` (`nil`: no token) as the shared token. `completion` runs once, on the
    /// writer thread, after Redis answered or the write timed out; or at once, on the caller's
    /// thread, when Redis is known to be down (the writer's last attempt failed and the
    /// subscription is not live either), the queue is full or the store is stopping: a request
    /// does not wait for a Redis known to be down. (A dropped subscription alone does not stop
    /// writes: the writer's own connection may be fine.)
    public func commit(token: String?, completion: @escaping @Sendable (WriteOutcome) -> Void) {
        let health = self.health
        let writerFailed = status.withLock { $0.writerFailed }
        if health != .connected && writerFailed {
            completion(.unavailable(health))
            return
        }
        if !enqueue(.change(token: token, enqueued: monotonicSeconds(), completion: completion)) {
            completion(.unavailable(health == .connected ? .unreachable : health))
        }
    }

    /// Reads (and reconciles) `PREFIX:state` now; `completion` gets the stored state, or `nil`
    /// when Redis could not be read. Used before serving a subscriber whose `Last-Event-ID` is
    /// above the replica's version.
    public func refresh(completion: @escaping @Sendable (SharedTokenState?) -> Void) {
        if !enqueue(.check(completion: completion)) { completion(nil) }
    }

    private func enqueue(_ job: Job) -> Bool {
        if status.withLock({ $0.stopping }) { return false }
        let accepted = queue.withLock { jobs -> Bool in
            guard jobs.count < configuration.queueCapacity else { return false }
            jobs.append(job)
            return true
        }
        if accepted { queueSignal.signal() }
        return accepted
    }

    /// Asks the writer for a state check unless one is already queued.
    private func requestCheck() {
        let needed = status.withLock { state -> Bool in
            if state.checkPending { return false }
            state.checkPending = true
            return true
        }
        if needed && !enqueue(.check(completion: nil)) {
            status.withLock { $0.checkPending = false }
        }
    }

    // MARK: - Health, logs, metrics

    private func setHealth(_ new: Health, detail: String) {
        healthReports.withLock { _ in decideHealth(new, detail: detail) }
    }

    private func decideHealth(_ new: Health, detail: String) {
        let now = monotonicSeconds()
        var lines: [(PushTokenManager.LogLevel, String)] = []
        let (changed, stateRead, callback) = status.withLock {
            state -> (Bool, Bool, (@Sendable (Health, Bool) -> Void)?) in
            let old = state.health
            if new == .connected {
                if !state.everConnected {
                    lines.append(
                        (.info, "Redis connected at \(configuration.endpoint), key prefix \(configuration.prefix)"))
                } else if let lostAt = state.lostAt {
                    let tenths = Int(((now - lostAt) * 10).rounded())
                    let gone = "\(tenths / 10).\(tenths % 10)"
                    lines.append((.info, "Redis back after \(gone) s at \(configuration.endpoint)"))
                }
                state.everConnected = true
                state.lostAt = nil
                state.lossLogged = false
                state.up = true
            } else {
                state.up = false
                if state.lostAt == nil { state.lostAt = now }
                if !state.lossLogged || old != new {
                    state.lossLogged = true
                    switch new {
                    case .invalidState:
                        lines.append(
                            (
                                .error,
                                "Redis key \(configuration.prefix.stateKey) holds data this service did not write (\(detail)); "
                                    + "it is never overwritten: inspect it with HGETALL \(configuration.prefix.stateKey) and delete it "
                                    + "(DEL \(configuration.prefix.stateKey)) so that the replicas write their state back"
                            ))
                    case .authFailed:
                        lines.append(
                            (
                                .warning,
                                "Redis at \(configuration.endpoint) refused the credentials (\(detail)); retrying in the background"
                            ))
                    default:
                        let when = state.everConnected ? "lost" : "unreachable at start"
                        lines.append(
                            (
                                .warning,
                                "Redis \(when) at \(configuration.endpoint) (\(detail)); retrying in the background"
                            ))
                    }
                }
            }
            state.health = new
            return (old != new, state.known != nil, state.callbacks?.onHealth)
        }
        for (level, line) in lines { log(level, line) }
        if changed { callback?(new, stateRead) }
    }

    private func countError() {
        status.withLock { $0.errors &+= 1 }
    }

    private func recordWrite(seconds: Double) {
        status.withLock { state in
            for (index, bound) in Self.writeBuckets.enumerated() where seconds <= bound {
                state.writeBuckets[index] &+= 1
            }
            state.writeCount &+= 1
            state.writeSum += seconds
        }
    }

    /// The store's metrics in the Prometheus text format (version 0.0.4): the gauge
    /// `forge_push_token_redis_up` (0 or 1), the counters `forge_push_token_redis_reconnects_total`
    /// and `forge_push_token_redis_errors_total`, and the histogram
    /// `forge_push_token_redis_write_seconds` (round trip of each commit, from enqueue to reply).
    public func renderMetrics() -> String {
        let snapshot = status.withLock { $0 }
        var out = ""
        out +=
            "# HELP forge_push_token_redis_up Whether the subscription to Redis is live and the state was read (1) or not (0).\n"
        out += "# TYPE forge_push_token_redis_up gauge\n"
        out += "forge_push_token_redis_up \(snapshot.up ? 1 : 0)\n"
        out += "# HELP forge_push_token_redis_reconnects_total Connections to Redis made again after one was lost.\n"
        out += "# TYPE forge_push_token_redis_reconnects_total counter\n"
        out += "forge_push_token_redis_reconnects_total \(snapshot.reconnects)\n"
        out += "# HELP forge_push_token_redis_errors_total Failed Redis connects, commands and timeouts.\n"
        out += "# TYPE forge_push_token_redis_errors_total counter\n"
        out += "forge_push_token_redis_errors_total \(snapshot.errors)\n"
        out += "# HELP forge_push_token_redis_write_seconds Round trip of a token write through Redis.\n"
        out += "# TYPE forge_push_token_redis_write_seconds histogram\n"
        for (index, bound) in Self.writeBuckets.enumerated() {
            out += "forge_push_token_redis_write_seconds_bucket{le=\"\(bound)\"} \(snapshot.writeBuckets[index])\n"
        }
        out += "forge_push_token_redis_write_seconds_bucket{le=\"+Inf\"} \(snapshot.writeCount)\n"
        out += "forge_push_token_redis_write_seconds_sum \(snapshot.writeSum)\n"
        out += "forge_push_token_redis_write_seconds_count \(snapshot.writeCount)\n"
        return out
    }

    private var callbacks: Callbacks? { status.withLock { $0.callbacks } }

    /// The newest state learned so far, or `nil` before the first.
    public var knownState: SharedTokenState? { status.withLock { $0.known } }

    /// Remembers `state` if it is newer than the known one, and hands it to `onState`.
    private func learned(_ state: SharedTokenState) {
        let callback = status.withLock { current -> (@Sendable (SharedTokenState) -> Void)? in
            if current.known == nil || current.known!.version < state.version { current.known = state }
            return current.callbacks?.onState
        }
        callback?(state)
    }
    private var stopping: Bool { status.withLock { $0.stopping } }

    private func health(for error: RedisConnectionError) -> Health {
        if case .authFailed = error { return .authFailed }
        return .unreachable
    }

    // MARK: - Writer

    private struct ScriptHashes {
        var change: String
        var sync: String
    }

    private func takeBatch() -> [Job]? {
        while true {
            let batch = queue.withLock { jobs -> [Job] in
                let taken = Array(jobs.prefix(64))
                jobs.removeFirst(taken.count)
                return taken
            }
            if stopping { return batch.isEmpty ? nil : batch }
            if !batch.isEmpty { return batch }
            // Extra signals (one per job already taken in a batch) only cause an empty round.
            _ = queueSignal.wait(timeout: .now() + .milliseconds(500))
        }
    }

    private func writerLoop() {
        var connection: RedisConnection?
        var hashes: ScriptHashes?
        while let batch = takeBatch() {
            if stopping {
                finish(batch, failing: .unavailable(.unreachable))
                continue
            }
            var pending = batch
            var mayRetry = true
            while !pending.isEmpty {
                let reused = connection != nil
                if connection == nil {
                    do throws(RedisConnectionError) {
                        let made = try RedisConnection(
                            endpoint: configuration.endpoint, timeout: configuration.writeTimeout)
                        hashes = try loadScripts(made)
                        connection = made
                    } catch {
                        countError()
                        status.withLock { $0.writerFailed = true }
                        let health = self.health(for: error)
                        if health == .authFailed { setHealth(.authFailed, detail: error.description) }
                        finish(pending, failing: .unavailable(health))
                        break
                    }
                }
                guard let live = connection, let scripts = hashes else { break }
                // A connection that sat idle may have died with a Redis that restarted: a batch that
                // fails on it with a broken socket (not a timeout) is sent once more on a new one.
                // Safe for commits: a write of the token that is already current changes nothing.
                switch run(pending, on: live, scripts: scripts, mayRetry: reused && mayRetry) {
                case .done(let keep):
                    if !keep { connection = nil }
                    pending = []
                case .retry(let rest):
                    connection = nil
                    pending = rest
                    mayRetry = false
                }
            }
        }
    }

    /// What became of a batch.
    private enum BatchResult {
        /// Every job was completed; `keep` is false when the connection must be made again.
        case done(keep: Bool)
        /// The connection broke before these jobs got a reply: send them again on a new one.
        case retry([Job])
    }

    private func loadScripts(_ connection: RedisConnection) throws(RedisConnectionError) -> ScriptHashes {
        func load(_ source: String) throws(RedisConnectionError) -> String {
            let reply = try connection.command(["SCRIPT", "LOAD", source], timeout: configuration.writeTimeout)
            if case .error(let message) = reply {
                throw RedisConnectionError.classify(errorReply: message) ?? .refused(String(message.prefix(120)))
            }
            guard let sha = reply.text else { throw .unreachable("unexpected SCRIPT LOAD reply") }
            return sha
        }
        return ScriptHashes(change: try load(RedisScripts.change), sync: try load(RedisScripts.sync))
    }

    private func arguments(for job: Job, scripts: ScriptHashes, source: Bool) -> [String] {
        let prefix = configuration.prefix
        let replica = RedisScripts.replicaArguments(knownState)
        switch job {
        case .change(let token, _, _):
            return [
                source ? "EVAL" : "EVALSHA", source ? RedisScripts.change : scripts.change, "2",
                prefix.stateKey, prefix.changesChannel, token ?? "",
            ] + replica
        case .check:
            return [
                source ? "EVAL" : "EVALSHA", source ? RedisScripts.sync : scripts.sync, "2",
                prefix.stateKey, prefix.changesChannel, "",
            ] + replica
        }
    }

    /// Sends `batch` pipelined and completes each job (or, with `mayRetry`, hands back the jobs
    /// that a broken connection left without a reply).
    private func run(_ batch: [Job], on connection: RedisConnection, scripts: ScriptHashes, mayRetry: Bool)
        -> BatchResult
    {
        // A commit that waited longer than the write timeout in the queue (behind a Redis that
        // stopped answering) is not sent: its request has waited long enough.
        let now = monotonicSeconds()
        var batch = batch
        batch.removeAll { job in
            guard case .change(_, let enqueued, let completion) = job, now - enqueued > configuration.writeTimeout
            else {
                return false
            }
            completion(.unavailable(.unreachable))
            return true
        }
        for job in batch { connection.append(arguments(for: job, scripts: scripts, source: false)) }
        do throws(RedisConnectionError) {
            try connection.flush()
        } catch {
            if mayRetry { return .retry(batch) }
            countError()
            status.withLock { $0.writerFailed = true }
            finish(batch, failing: .unknown)
            return .done(keep: false)
        }
        let deadline = monotonicSeconds() + configuration.writeTimeout
        var keep = true
        var retry: [Job] = []
        for (index, job) in batch.enumerated() {
            let reply: RedisReply
            do throws(RedisConnectionError) {
                reply = try connection.readReply(deadline: deadline)
            } catch {
                if mayRetry, index == 0, error != .timedOut { return .retry(batch) }
                countError()
                status.withLock { $0.writerFailed = true }
                finish(Array(batch[index...]), failing: .unknown)
                if case .timedOut = error {
                    log(.warning, "Redis did not answer within \(configuration.writeTimeout) s; reconnecting")
                }
                return .done(keep: false)
            }
            if index == 0 { status.withLock { $0.writerFailed = false } }
            if reply.errorCode == "NOSCRIPT" {
                retry.append(job)
                continue
            }
            if !complete(job, with: reply) { keep = false }
        }
        for job in retry {
            do throws(RedisConnectionError) {
                let reply = try connection.command(
                    arguments(for: job, scripts: scripts, source: true),
                    timeout: configuration.writeTimeout)
                if !complete(job, with: reply) { keep = false }
            } catch {
                countError()
                finish([job], failing: .unknown)
                return .done(keep: false)
            }
        }
        return .done(keep: keep)
    }

    /// Completes one job from its reply; returns false when the connection must be made again.
    private func complete(_ job: Job, with reply: RedisReply) -> Bool {
        if case .error(let message) = reply {
            countError()
            let health: Health
            var keep = true
            if message.hasPrefix("INVALIDSTATE ") {
                health = .invalidState
                setHealth(.invalidState, detail: String(message.dropFirst("INVALIDSTATE ".count)))
            } else if let connectionError = RedisConnectionError.classify(errorReply: message) {
                health = self.health(for: connectionError)
                keep = false
                log(.warning, "Redis refused a write: \(connectionError); reconnecting")
            } else {
                health = .unreachable
                log(.error, "Redis script failed: \(message.prefix(200))")
            }
            finish([job], failing: .unavailable(health))
            return keep
        }
        let result: RedisScripts.Result
        do {
            result = try RedisScripts.parse(reply)
        } catch {
            countError()
            log(.error, "Redis script reply not understood: \(error)")
            finish([job], failing: .unavailable(.unreachable))
            return true
        }
        switch result.reconciliation {
        case .written:
            let previous = result.previousVersion.map { "version \($0)" } ?? "a missing key"
            log(.warning, "Redis had lost the state (\(previous)); wrote back this replica's \(result.state)")
        case .bumped:
            log(
                .warning,
                "Redis held another token at this replica's version \(result.previousVersion ?? 0); "
                    + "the stored token wins at \(result.state)")
        case .none:
            break
        }
        learned(result.state)
        switch job {
        case .change(_, let enqueued, let completion):
            recordWrite(seconds: monotonicSeconds() - enqueued)
            completion(.applied(result.state, changed: result.changed))
        case .check(let completion):
            let subscribed = status.withLock { state -> Bool in
                if completion == nil { state.checkPending = false }
                return state.subscribed
            }
            if subscribed { setHealth(.connected, detail: "") }
            completion?(result.state)
        }
        return true
    }

    private func finish(_ jobs: [Job], failing outcome: WriteOutcome) {
        for job in jobs {
            switch job {
            case .change(_, _, let completion):
                completion(outcome)
            case .check(let completion):
                if completion == nil { status.withLock { $0.checkPending = false } }
                if case .unavailable(let health) = outcome, health == .authFailed || health == .invalidState {
                    // Already reported by whoever saw it.
                } else if status.withLock({ $0.health == .connected }) {
                    setHealth(.unreachable, detail: "a state check failed")
                }
                completion?(nil)
            }
        }
    }

    // MARK: - Subscriber

    private func sleep(seconds: Double) {
        let end = monotonicSeconds() + seconds
        while !stopping {
            let left = end - monotonicSeconds()
            if left <= 0 { return }
            usleep(useconds_t(min(left, 0.05) * 1_000_000))
        }
    }

    private func subscriberLoop() {
        var backoff = ReconnectBackoff()
        var first = true
        let channel = configuration.prefix.changesChannel
        while !stopping {
            let connection: RedisConnection
            do throws(RedisConnectionError) {
                connection = try RedisConnection(endpoint: configuration.endpoint, timeout: configuration.writeTimeout)
                connection.append(["SUBSCRIBE", channel])
                try connection.flush()
                let reply = try connection.readReply(deadline: monotonicSeconds() + configuration.writeTimeout)
                guard case .array(let items) = reply, items.first?.text == "subscribe" else {
                    if case .error(let message) = reply {
                        throw RedisConnectionError.classify(errorReply: message)
                            ?? .refused(String(message.prefix(120)))
                    }
                    throw .unreachable("unexpected SUBSCRIBE reply")
                }
            } catch {
                countError()
                setHealth(health(for: error), detail: error.description)
                sleep(seconds: backoff.next())
                continue
            }
            backoff.reset()
            if !first { status.withLock { $0.reconnects &+= 1 } }
            first = false
            status.withLock { $0.subscribed = true }
            requestCheck()
            let why = listen(on: connection, channel: channel)
            status.withLock { $0.subscribed = false }
            if let why {
                countError()
                setHealth(.unreachable, detail: why)
                sleep(seconds: backoff.next())
            }
        }
    }

    /// Reads messages until the connection fails (returns why) or the store stops (nil).
    private func listen(on connection: RedisConnection, channel: String) -> String? {
        var lastPing = monotonicSeconds()
        var pingSent: Double?
        var lastCheck = monotonicSeconds()
        while !stopping {
            let reply: RedisReply?
            do throws(RedisConnectionError) {
                reply = try connection.pollReply(milliseconds: 100)
            } catch {
                return error.description
            }
            if let reply {
                switch reply {
                case .array(let items) where items.first?.text == "message" && items.count == 3:
                    if case .bulk(let payload) = items[2] {
                        do {
                            let state = try SharedTokenState.fromChangeMessage(payload)
                            learned(state)
                        } catch {
                            countError()
                            log(.warning, "ignored a message on \(channel) that this service did not write: \(error)")
                            requestCheck()
                        }
                    }
                case .array(let items) where items.first?.text?.lowercased() == "pong":
                    pingSent = nil
                case .status(let text) where text == "PONG":
                    pingSent = nil
                case .error(let message):
                    return "error on the subscription: \(message.prefix(120))"
                default:
                    break
                }
            }
            let now = monotonicSeconds()
            if let sent = pingSent {
                if now - sent > configuration.heartbeatTimeout {
                    return "no answer to PING within \(Int(configuration.heartbeatTimeout)) s"
                }
            } else if now - lastPing >= configuration.heartbeatInterval {
                connection.append(["PING"])
                do throws(RedisConnectionError) { try connection.flush() } catch { return error.description }
                pingSent = now
                lastPing = now
            }
            if now - lastCheck >= configuration.checkInterval {
                lastCheck = now
                requestCheck()
            }
        }
        return nil
    }
}

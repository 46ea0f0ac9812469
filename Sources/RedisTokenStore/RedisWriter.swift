import ForgePushToken
import ForgePushTokenOwner
import ServerSupport

/// The store's writer: one thread with its own connection that runs every commit and every check
/// of `PREFIX:state` through the scripts of `RedisScripts` (docs/replicas.md, "What lives in
/// Redis").
///
/// It takes what is queued (`RedisJobQueue`), sends it as one pipelined batch (`EVALSHA`, `EVAL`
/// again on `NOSCRIPT`) and waits at most the write timeout for the replies: no reply in time is
/// `.unknown`, and the connection is made again. What each reply or failure means is
/// `RedisWriterStateMachine`'s decision, as a value (which job a reply belongs to is `RedisBatch`'s,
/// inside it): the log lines, the counts, the link machine's events and each job's outcome come
/// back as actions, which the writer carries out in order (`perform`). Every job gets exactly one
/// outcome, and every check ends (`checkSucceeded` or `checkFailed`), whatever step fails. A
/// commit's outcome goes to its `RedisWriteAnswer` alone (the owner applies it there), which
/// `RedisWriteDeadlines` answers `.unknown` at the write timeout after it was queued if the writer
/// has not (the queue, a reconnect and `SCRIPT LOAD` included); a check's state goes to the owner
/// through `RedisLink.learned`.
/// A batch that fails on a connection that sat idle with a broken socket (not a timeout) is sent
/// once more on a new one: safe, since a write of the current token changes nothing. Every log line
/// a reply causes is limited to one per 10 s per kind (`RedisTelemetry.logLimited`): a hostile Redis
/// answering each read with an error must not flood the log.
///
/// Thread-safety: `run()` is called once, on the writer's own thread; nothing else is shared but
/// the link.
final class RedisWriter: Sendable {
    private let link: RedisLink

    /// A writer for `link`.
    init(link: RedisLink) {
        self.link = link
    }

    private var configuration: RedisTokenStore.Configuration { link.configuration }

    private struct ScriptHashes {
        var change: String
        var sync: String
    }

    /// What became of a batch.
    private enum BatchResult {
        /// Every job was completed; `keep` is false when the connection must be made again.
        case done(keep: Bool)
        /// The connection broke before these jobs got a reply: send them again on a new one.
        case retry([RedisJobQueue.Job])
    }

    private typealias Machine = RedisWriterStateMachine<RedisJobQueue.Job>

    /// Runs until the store stops, then fails what is left.
    func run() {
        var connection: RedisConnection?
        var hashes: ScriptHashes?
        while let (batch, stopped) = link.queue.take() {
            if stopped {
                perform(Machine.fail(batch, .unavailable(.unreachable, detail: "the replica is stopping")))
                continue
            }
            var pending = batch
            var mayRetry = true
            while !pending.isEmpty {
                // The sentinels announced a new master: leave the old one before writing.
                if let live = connection, link.connector.hasMoved(live) { connection = nil }
                let reused = connection != nil
                if connection == nil {
                    do throws(RedisConnectionError) {
                        let made = try link.connector.connect()
                        hashes = try loadScripts(made)
                        connection = made
                    } catch {
                        let health = RedisLinkStateMachine.Health(error)
                        perform(
                            Machine.connectionFailed(error)
                                + Machine.fail(pending, .unavailable(health, detail: error.description)))
                        break
                    }
                }
                guard let live = connection, let scripts = hashes else {
                    // Not reached (both are set together above); were it, no job is dropped.
                    perform(Machine.fail(pending, .unavailable(.unreachable, detail: "no connection to Redis")))
                    break
                }
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

    /// Loads both scripts, pipelined: one write and one wait of at most the write timeout.
    private func loadScripts(_ connection: RedisConnection) throws(RedisConnectionError) -> ScriptHashes {
        connection.append(["SCRIPT", "LOAD", RedisScripts.change])
        connection.append(["SCRIPT", "LOAD", RedisScripts.sync])
        try connection.flush()
        let deadline = monotonicSeconds() + configuration.writeTimeout
        func hash() throws(RedisConnectionError) -> String {
            let reply = try connection.readReply(deadline: deadline)
            if case .error(let message) = reply {
                throw RedisConnectionError.classify(errorReply: message) ?? .refused(String(message.prefix(120)))
            }
            guard let sha = reply.text else { throw .unreachable("unexpected SCRIPT LOAD reply") }
            return sha
        }
        let change = try hash()
        return ScriptHashes(change: change, sync: try hash())
    }

    private func arguments(for job: RedisJobQueue.Job, scripts: ScriptHashes, source: Bool) -> [String] {
        let prefix = configuration.prefix
        let replica = RedisScripts.replicaArguments(link.replicaState, writer: link.writerID)
        switch job {
        case .change(let token, _):
            return [
                source ? "EVAL" : "EVALSHA", source ? RedisScripts.change : scripts.change, "2",
                prefix.stateKey, prefix.changesChannel, token ?? "",
            ] + replica
        case .check:
            return [
                source ? "EVAL" : "EVALSHA", source ? RedisScripts.sync : scripts.sync, "2",
                prefix.stateKey, prefix.changesChannel, "",
            ] + replica
        case .probe(let sequence):
            return ["PUBLISH", prefix.probeChannel, RedisCodec.probe(writer: link.writerID, sequence: sequence)]
        }
    }

    /// Sends `jobs` pipelined and completes each job (or, with `mayRetry`, hands back the jobs
    /// when the connection broke before any reply: it may have sat idle with a broken socket).
    /// What each reply means is `RedisBatch`'s decision: a `NOSCRIPT` sends the job again as
    /// `EVAL`, and a failure at any step fails every job left without a reply (none is dropped).
    private func run(
        _ jobs: [RedisJobQueue.Job], on connection: RedisConnection, scripts: ScriptHashes, mayRetry: Bool
    )
        -> BatchResult
    {
        // A write already answered (its deadline passed while it waited behind a Redis that
        // stopped answering, `RedisWriteDeadlines`) is not sent.
        let jobs = jobs.filter { job in
            guard case .change(_, let answer) = job else { return true }
            return !answer.isGiven
        }
        var machine = Machine(jobs, writeTimeout: configuration.writeTimeout, stateKey: configuration.prefix.stateKey)
        var round = jobs
        while !round.isEmpty {
            let source = machine.round == .source
            for job in round { connection.append(arguments(for: job, scripts: scripts, source: source)) }
            do throws(RedisConnectionError) {
                try connection.flush()
                // The batch's read ends at the write timeout on the link's clock (a test's manual
                // clock decides when the writer gives up, as it decides the write's own deadline).
                let deadline = link.now() + configuration.writeTimeout
                while !machine.roundDone {
                    let reply = try connection.readReply(deadline: deadline, on: configuration.clock)
                    perform(machine.replied(reply, at: monotonicSeconds()))
                }
            } catch {
                switch machine.failed(error, mayRetry: mayRetry) {
                case .retry(let again): return .retry(again)
                case .fail(let actions): perform(actions)
                }
                return .done(keep: false)
            }
            round = machine.nextRound()
        }
        return .done(keep: machine.keep)
    }

    /// Carries out the machine's actions, in order, with no lock held.
    private func perform(_ actions: [Machine.Action]) {
        for action in actions {
            switch action {
            case .countError: link.telemetry.countError()
            case .log(let key, let level, let line): link.telemetry.logLimited(key, level, line)
            case .oversized(let detail): link.telemetry.ignored(.oversized, detail)
            case .link(let event): link.handle { [link] in Self.run(event, at: link.now(), on: &$0) }
            case .replied: link.note { $0.writerReplied() }
            case .probeNotSent(let sequence): link.note { $0.probeNotSent(sequence: sequence) }
            case .recordWrite(let seconds): link.telemetry.recordWrite(seconds: seconds)
            case .committed(let job, let outcome, let state):
                // The owner applies it from the answer: this is how it reaches the owner, once.
                link.committed()
                if case .change(_, let answer) = job, !answer.give(outcome) {
                    // Answered at its deadline already: the owner learns the state Redis holds as
                    // it learns another replica's (its own change message is skipped).
                    link.learned(state)
                }
            case .answer(let job, let outcome):
                if case .change(_, let answer) = job { answer.give(outcome) }
            case .learned(let state): link.learned(state)
            }
        }
    }

    /// Runs `event` through the link's machine at `now` (the link's clock).
    private static func run(
        _ event: Machine.LinkEvent, at now: Double, on machine: inout RedisLinkStateMachine
    ) -> [RedisLinkStateMachine.Action] {
        switch event {
        case .writerFailed(let health, let detail): return machine.writerFailed(health, detail: detail, at: now)
        case .invalidState(let detail): return machine.invalidState(detail: detail, at: now)
        case .versionSeen(let atMaximum): return machine.versionSeen(atMaximum: atMaximum, at: now)
        case .checkSucceeded(let state): return machine.checkSucceeded(at: now, read: state)
        case .checkFailed(let health, let detail): return machine.checkFailed(health, detail: detail, at: now)
        case .refreshRequested: return machine.refreshRequested(at: now)
        }
    }
}

extension RedisLinkStateMachine.Health {
    /// The health a connection error means: `auth_failed` for refused credentials, `tls_failed`
    /// for a failed TLS handshake or certificate, `sentinels_unreachable` and `no_master` for a
    /// master the sentinels could not give, else `unreachable`.
    init(_ error: RedisConnectionError) {
        switch error {
        case .authFailed: self = .authFailed
        case .tlsFailed: self = .tlsFailed
        case .sentinelsUnreachable: self = .sentinelsUnreachable
        case .noMaster: self = .noMaster
        case .unreachable, .timedOut, .refused, .replyTooLarge: self = .unreachable
        }
    }
}

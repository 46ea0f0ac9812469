import ForgePushToken
import ForgePushTokenOwner
import ServerSupport

/// The store's writer: one thread with its own connection that runs every commit and every check
/// of `PREFIX:state` through the scripts of `RedisScripts` (docs/replicas.md, "What lives in
/// Redis").
///
/// It takes what is queued (`RedisJobQueue`), sends it as one pipelined batch (`EVALSHA`, `EVAL`
/// again on `NOSCRIPT`) and waits at most the write timeout for the replies: no reply in time is
/// `.unknown`, and the connection is made again. What each reply means, and which jobs a failure
/// leaves to fail, is `RedisBatch`'s decision: every job gets exactly one outcome, and every check
/// ends (`checkSucceeded` or `checkFailed`), whatever step fails. A commit's outcome goes to its
/// `RedisWriteAnswer` alone (the owner applies it there), which `RedisWriteDeadlines` answers
/// `.unknown` at the write timeout after it was queued if the writer has not (the queue, a
/// reconnect and `SCRIPT LOAD` included); a check's state goes to the owner through
/// `RedisLink.learned`.
/// A batch that fails on a connection that sat idle with a broken socket (not a timeout) is sent
/// once more on a new one: safe, since a write of the current token changes nothing. Every log line
/// a reply causes is limited to one per 10 s per kind (`RedisLink.logLimited`): a hostile Redis
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

    /// How a job that got no answer ends.
    private enum Failure {
        /// Not sent, or refused: nothing was written. The link's health says why.
        case unavailable(RedisLinkStateMachine.Health, detail: String)
        /// Sent, but no reply in time: it may or may not have been applied.
        case unknown(detail: String)
        /// Refused by the script: no version is left above 2^53 - 1. Nothing was written.
        case versionExhausted
    }

    /// Runs until the store stops, then fails what is left.
    func run() {
        var connection: RedisConnection?
        var hashes: ScriptHashes?
        while let (batch, stopped) = link.queue.take() {
            if stopped {
                finish(batch, failing: .unavailable(.unreachable, detail: "the replica is stopping"))
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
                        link.telemetry.countError()
                        let health = RedisLinkStateMachine.Health(error)
                        link.handle { $0.writerFailed(health, detail: error.description, at: monotonicSeconds()) }
                        finish(pending, failing: .unavailable(health, detail: error.description))
                        break
                    }
                }
                guard let live = connection, let scripts = hashes else {
                    // Not reached (both are set together above); were it, no job is dropped.
                    finish(pending, failing: .unavailable(.unreachable, detail: "no connection to Redis"))
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
        var batch = RedisBatch(jobs)
        var keep = true
        var round = jobs
        while !round.isEmpty {
            let source = batch.round == .source
            for job in round { connection.append(arguments(for: job, scripts: scripts, source: source)) }
            do throws(RedisConnectionError) {
                try connection.flush()
                let deadline = monotonicSeconds() + configuration.writeTimeout
                while !batch.roundDone {
                    let reply = try connection.readReply(deadline: deadline)
                    if !batch.anyReply { link.note { $0.writerReplied() } }
                    if case .complete(let job, let reply) = batch.replied(reply), !complete(job, with: reply) {
                        keep = false
                    }
                }
            } catch {
                if mayRetry, !batch.anyReply, error != .timedOut { return .retry(jobs) }
                failed(error)
                if case .timedOut = error {
                    link.telemetry.logLimited(
                        "writer.timeout", .warning,
                        "Redis did not answer within \(configuration.writeTimeout) s; reconnecting")
                }
                finish(batch.failed(), failing: .unknown(detail: error.description))
                return .done(keep: false)
            }
            round = batch.nextRound()
        }
        return .done(keep: keep)
    }

    private func failed(_ error: RedisConnectionError) {
        link.telemetry.countError()
        if case .replyTooLarge = error {
            // A lost connection (made again for the next batch), and a line naming the limit.
            link.telemetry.ignored(.oversized, "Redis sent the writer \(error); reconnecting")
        }
        let health = RedisLinkStateMachine.Health(error)
        link.handle { $0.writerFailed(health, detail: error.description, at: monotonicSeconds()) }
    }

    /// Completes one job from its reply; returns false when the connection must be made again.
    private func complete(_ job: RedisJobQueue.Job, with reply: RedisReply) -> Bool {
        if case .probe(let sequence) = job {
            // PUBLISH answers the number of subscribers that got it; an error is not delivery's
            // fault: the probe counts as not sent.
            if case .error(let message) = reply {
                link.telemetry.countError()
                link.telemetry.logLimited(
                    "writer.probe_refused", .warning, "Redis refused the delivery probe: \(message.prefix(120))")
                link.note { $0.probeNotSent(sequence: sequence) }
                return RedisConnectionError.classify(errorReply: message) == nil
            }
            return true
        }
        if case .error(let message) = reply {
            link.telemetry.countError()
            if message.hasPrefix("INVALIDSTATE ") {
                let detail = String(message.dropFirst("INVALIDSTATE ".count))
                link.handle { $0.invalidState(detail: detail, at: monotonicSeconds()) }
                finish([job], failing: .unavailable(.invalidState, detail: detail))
                return true
            }
            if message.hasPrefix("VERSIONEXHAUSTED ") {
                let detail = String(message.dropFirst("VERSIONEXHAUSTED ".count))
                link.telemetry.logLimited(
                    "writer.version_exhausted", .error,
                    "a change was refused (\(detail)): \(TokenState.versionExhausted); the key is "
                        + configuration.prefix.stateKey
                )
                link.handle { $0.versionSeen(atMaximum: true, at: monotonicSeconds()) }
                finish([job], failing: .versionExhausted)
                return true
            }
            if let connectionError = RedisConnectionError.classify(errorReply: message) {
                let health = RedisLinkStateMachine.Health(connectionError)
                link.telemetry.logLimited(
                    "writer.refused", .warning, "Redis refused a write: \(connectionError); reconnecting")
                finish([job], failing: .unavailable(health, detail: connectionError.description))
                return false
            }
            link.telemetry.logLimited("writer.script_failed", .error, "Redis script failed: \(message.prefix(200))")
            finish([job], failing: .unavailable(.unreachable, detail: "the script failed"))
            return true
        }
        let result: RedisScripts.Result
        do {
            result = try RedisScripts.parse(reply)
        } catch {
            link.telemetry.countError()
            link.telemetry.logLimited("writer.reply", .error, "Redis script reply not understood: \(error)")
            link.handle { $0.invalidState(detail: error.reason, at: monotonicSeconds()) }
            finish([job], failing: .unavailable(.invalidState, detail: error.reason))
            return true
        }
        link.handle {
            $0.versionSeen(atMaximum: result.state.version >= RedisCodec.maximumVersion, at: monotonicSeconds())
        }
        switch result.reconciliation {
        case .written:
            let previous = result.previousVersion.map { "version \($0)" } ?? "a missing key"
            link.telemetry.logLimited(
                "writer.written_back", .warning,
                "Redis had lost the state (\(previous)); wrote back this replica's \(result.state)")
        case .bumped:
            link.telemetry.logLimited(
                "writer.bumped", .warning,
                "Redis held another token at this replica's version \(result.previousVersion ?? 0); "
                    + "the stored token wins at \(result.state)")
        case .none:
            break
        }
        switch job {
        case .change(_, let answer):
            link.telemetry.recordWrite(seconds: monotonicSeconds() - answer.enqueued)
            // The owner applies it from the answer: this is how it reaches the owner, once.
            link.committed()
            if !answer.give(result.changed ? .applied(result.state) : .unchanged(result.state)) {
                // Answered at its deadline already: the owner learns the state Redis holds as it
                // learns another replica's (its own change message is skipped).
                link.learned(result.state)
            }
        case .check:
            link.learned(result.state)
            link.handle { $0.checkSucceeded(at: monotonicSeconds(), read: result.state) }
        case .probe:
            // Answered before the scripts' replies are read (above).
            break
        }
        return true
    }

    /// The reason of `.unavailable` for `health`.
    static func reason(_ health: RedisLinkStateMachine.Health) -> String {
        "Redis: \(health.rawValue)"
    }

    private func finish(_ jobs: [RedisJobQueue.Job], failing failure: Failure) {
        defer {
            // A write that may have been applied: read the state soon, since this replica's own
            // change message is skipped and no reply will tell the owner.
            if case .unknown = failure, jobs.contains(where: { if case .change = $0 { true } else { false } }) {
                link.handle { $0.refreshRequested(at: monotonicSeconds()) }
            }
        }
        for job in jobs {
            switch job {
            case .change(_, let answer):
                switch failure {
                case .unavailable(let health, _): answer.give(.unavailable(reason: Self.reason(health)))
                case .unknown: answer.give(.unknown(reason: "Redis did not answer the write in time"))
                case .versionExhausted: answer.give(.versionExhausted)
                }
            case .probe(let sequence):
                // A failed PUBLISH is the writer's failure (`unreachable`), not `not_delivering`.
                link.note { $0.probeNotSent(sequence: sequence) }
            case .check:
                switch failure {
                case .unavailable(let health, let detail):
                    link.handle { $0.checkFailed(health, detail: detail, at: monotonicSeconds()) }
                case .unknown(let detail):
                    link.handle { $0.checkFailed(.unreachable, detail: detail, at: monotonicSeconds()) }
                case .versionExhausted:
                    link.handle {
                        $0.checkFailed(.unreachable, detail: TokenState.versionExhausted, at: monotonicSeconds())
                    }
                }
            }
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

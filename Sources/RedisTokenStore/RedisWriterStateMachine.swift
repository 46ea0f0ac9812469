import ForgePushToken
import ForgePushTokenOwner
import ServerSupport

/// What kind of work a writer job is, as the writer's decisions see it (`RedisJobQueue.Job`; the
/// tests' own jobs).
enum RedisWriterJobKind: Equatable, Sendable {
    /// A commit of a token, queued at `enqueued` (monotonic seconds).
    case change(enqueued: Double)
    /// A read and reconciliation of `PREFIX:state`.
    case check
    /// Delivery probe number `sequence`.
    case probe(sequence: UInt64)
}

/// A job the writer's state machine can decide about.
protocol RedisWriterJob {
    /// What kind of work it is.
    var writerKind: RedisWriterJobKind { get }
}

/// The writer's decisions on one pipelined batch, as a value (`RedisWriter` sends, reads and
/// carries out the actions; this decides): what each reply means (classification), what it
/// logs and counts, what it tells the link's machine (`RedisLinkStateMachine`) and what outcome
/// each job gets; and, when the connection fails, which jobs are sent again on a new connection
/// and how the rest fail. `RedisBatch` (held here) decides which job a reply belongs to and which
/// are sent again as `EVAL` after a `NOSCRIPT`.
///
/// Every job of the batch ends exactly once: by its reply (`replied`), by the failure of the
/// connection (`failed`), or sent again whole (`failed` hands back `.retry`). The actions come
/// in the order they are to be carried out.
///
/// Thread-safety: a value; the writer's thread alone uses each machine.
struct RedisWriterStateMachine<Job: RedisWriterJob> {
    /// A link machine event the writer runs (`RedisLink.handle`), in the order given.
    enum LinkEvent: Equatable, Sendable {
        /// `RedisLinkStateMachine.writerFailed`.
        case writerFailed(RedisLinkStateMachine.Health, detail: String)
        /// `RedisLinkStateMachine.invalidState`.
        case invalidState(detail: String)
        /// `RedisLinkStateMachine.versionSeen`.
        case versionSeen(atMaximum: Bool)
        /// `RedisLinkStateMachine.checkSucceeded`, with the state read.
        case checkSucceeded(read: TokenState)
        /// `RedisLinkStateMachine.checkFailed`.
        case checkFailed(RedisLinkStateMachine.Health, detail: String)
        /// `RedisLinkStateMachine.refreshRequested`: read the state soon.
        case refreshRequested
    }

    /// A side effect the writer carries out, after deciding.
    enum Action {
        /// Count a failed command or wait (`RedisTelemetry.countError`).
        case countError
        /// Log `line` at `level`, at most once per 10 s per `key` (`RedisTelemetry.logLimited`).
        case log(key: String, ServerLogLevel, String)
        /// A reply over the size limit: count it and log `detail` (`RedisTelemetry.ignored`).
        case oversized(detail: String)
        /// Run `event` through the link's machine.
        case link(LinkEvent)
        /// The first reply of the batch was read (`RedisLinkStateMachine.writerReplied`).
        case replied
        /// A probe counts as not sent (`RedisLinkStateMachine.probeNotSent`).
        case probeNotSent(sequence: UInt64)
        /// Record a commit's round trip of `seconds` (`RedisTelemetry.recordWrite`).
        case recordWrite(seconds: Double)
        /// A commit came back from Redis holding `state`: the link knows a state
        /// (`RedisLink.committed`), and `job` is answered `outcome`; if its deadline answered it
        /// already, the owner learns `state` as it learns another replica's (`RedisLink.learned`).
        case committed(Job, CommitOutcome, state: TokenState)
        /// Answer the change `job` with `outcome` (once: a job answered at its deadline keeps that).
        case answer(Job, CommitOutcome)
        /// A check read `state`: the owner learns it when newer (`RedisLink.learned`).
        case learned(TokenState)
    }

    /// How a job that got no answer ends.
    enum Failure: Equatable, Sendable {
        /// Not sent, or refused: nothing was written. The link's health says why.
        case unavailable(RedisLinkStateMachine.Health, detail: String)
        /// Sent, but no reply in time: it may or may not have been applied.
        case unknown(detail: String)
        /// Refused by the script: no version is left above 2^53 - 1. Nothing was written.
        case versionExhausted
    }

    /// What a failed connection decided.
    enum Failed {
        /// Send these jobs again on a new connection (no reply was read: the connection may
        /// have sat idle with a broken socket).
        case retry([Job])
        /// Carry out these actions; the batch is done and the connection is made again.
        case fail([Action])
    }

    /// Which job each reply completes, and the `NOSCRIPT` rounds.
    private(set) var batch: RedisBatch<Job>
    /// Whether the connection may be kept after the batch (false once a reply said to reconnect).
    private(set) var keep = true
    private let writeTimeout: Double
    private let stateKey: String

    /// A machine for `jobs`, sent first as `EVALSHA` (`RedisBatch`); `writeTimeout` (seconds) and
    /// `stateKey` (`PREFIX:state`) go into its log lines.
    init(_ jobs: [Job], writeTimeout: Double, stateKey: String) {
        self.batch = RedisBatch(jobs)
        self.writeTimeout = writeTimeout
        self.stateKey = stateKey
    }

    /// The round in flight (`RedisBatch.round`).
    var round: RedisBatch<Job>.Round { batch.round }

    /// Whether every reply of the round in flight was read.
    var roundDone: Bool { batch.roundDone }

    /// Once `roundDone`: the jobs of the next round (`RedisBatch.nextRound`), empty when done.
    mutating func nextRound() -> [Job] { batch.nextRound() }

    /// The next reply of the round in flight arrived at `now`: what to do. Call only while
    /// `roundDone` is false.
    mutating func replied(_ reply: RedisReply, at now: Double) -> [Action] {
        var actions: [Action] = batch.anyReply ? [] : [.replied]
        guard case .complete(let job, let reply) = batch.replied(reply) else { return actions }
        let (completed, keeps) = Self.complete(
            job, with: reply, at: now, stateKey: stateKey)
        if !keeps { keep = false }
        actions += completed
        return actions
    }

    /// The connection failed with `error`; `mayRetry` when it was reused from an earlier batch and
    /// this batch was not sent again already.
    mutating func failed(_ error: RedisConnectionError, mayRetry: Bool) -> Failed {
        if mayRetry, !batch.anyReply, error != .timedOut { return .retry(batch.jobs) }
        var actions = Self.connectionFailed(error)
        if case .timedOut = error {
            actions.append(
                .log(
                    key: "writer.timeout", .warning,
                    "Redis did not answer within \(writeTimeout) s; reconnecting"))
        }
        actions += Self.fail(batch.failed(), .unknown(detail: error.description))
        keep = false
        return .fail(actions)
    }

    /// A connection (or a connect) failed with `error`: count it, and tell the link's machine.
    static func connectionFailed(_ error: RedisConnectionError) -> [Action] {
        var actions: [Action] = [.countError]
        if case .replyTooLarge = error {
            // A lost connection (made again for the next batch), and a line naming the limit.
            actions.append(.oversized(detail: "Redis sent the writer \(error); reconnecting"))
        }
        actions.append(.link(.writerFailed(RedisLinkStateMachine.Health(error), detail: error.description)))
        return actions
    }

    /// `jobs` end without a reply, for `failure`.
    static func fail(_ jobs: [Job], _ failure: Failure) -> [Action] {
        var actions: [Action] = []
        var anyChange = false
        for job in jobs {
            switch job.writerKind {
            case .change:
                anyChange = true
                switch failure {
                case .unavailable(let health, _):
                    actions.append(.answer(job, .unavailable(reason: health.unavailableReason)))
                case .unknown: actions.append(.answer(job, .unknown(reason: "Redis did not answer the write in time")))
                case .versionExhausted: actions.append(.answer(job, .versionExhausted))
                }
            case .probe(let sequence):
                // A failed PUBLISH is the writer's failure (`unreachable`), not `not_delivering`.
                actions.append(.probeNotSent(sequence: sequence))
            case .check:
                switch failure {
                case .unavailable(let health, let detail): actions.append(.link(.checkFailed(health, detail: detail)))
                case .unknown(let detail): actions.append(.link(.checkFailed(.unreachable, detail: detail)))
                case .versionExhausted:
                    actions.append(.link(.checkFailed(.unreachable, detail: TokenState.versionExhausted)))
                }
            }
        }
        // A write that may have been applied: read the state soon, since this replica's own
        // change message is skipped and no reply will tell the owner.
        if case .unknown = failure, anyChange { actions.append(.link(.refreshRequested)) }
        return actions
    }

    /// What `reply` means for `job`, and whether the connection may be kept.
    private static func complete(
        _ job: Job, with reply: RedisReply, at now: Double, stateKey: String
    ) -> (actions: [Action], keep: Bool) {
        if case .error(let message) = reply {
            return refused(job, message: message, stateKey: stateKey)
        }
        if case .probe = job.writerKind {
            // PUBLISH answers the number of subscribers that got it.
            return ([], true)
        }
        let result: RedisScripts.Result
        do {
            result = try RedisScripts.parse(reply)
        } catch {
            return (
                [
                    .countError, .log(key: "writer.reply", .error, "Redis script reply not understood: \(error)"),
                    .link(.invalidState(detail: error.reason)),
                ] + fail([job], .unavailable(.invalidState, detail: error.reason)), true
            )
        }
        var actions: [Action] = [.link(.versionSeen(atMaximum: result.state.version >= RedisCodec.maximumVersion))]
        switch result.reconciliation {
        case .written:
            let previous = result.previousVersion.map { "version \($0)" } ?? "a missing key"
            actions.append(
                .log(
                    key: "writer.written_back", .warning,
                    "Redis had lost the state (\(previous)); wrote back this replica's \(result.state)"))
        case .bumped:
            actions.append(
                .log(
                    key: "writer.bumped", .warning,
                    "Redis held another token at this replica's version \(result.previousVersion ?? 0); "
                        + "the stored token wins at \(result.state)"))
        case .none:
            break
        }
        switch job.writerKind {
        case .change(let enqueued):
            actions.append(.recordWrite(seconds: now - enqueued))
            let outcome: CommitOutcome = result.changed ? .applied(result.state) : .unchanged(result.state)
            actions.append(.committed(job, outcome, state: result.state))
        case .check:
            actions += [.learned(result.state), .link(.checkSucceeded(read: result.state))]
        case .probe:
            break
        }
        return (actions, true)
    }

    /// What an error reply to `job` means, and whether the connection may be kept.
    private static func refused(_ job: Job, message: String, stateKey: String) -> (actions: [Action], keep: Bool) {
        if case .probe(let sequence) = job.writerKind {
            // An error is not delivery's fault: the probe counts as not sent.
            return (
                [
                    .countError,
                    .log(
                        key: "writer.probe_refused", .warning,
                        "Redis refused the delivery probe: \(message.prefix(120))"),
                    .probeNotSent(sequence: sequence),
                ], RedisConnectionError.classify(errorReply: message) == nil
            )
        }
        if message.hasPrefix("INVALIDSTATE ") {
            let detail = String(message.dropFirst("INVALIDSTATE ".count))
            return (
                [.countError, .link(.invalidState(detail: detail))]
                    + fail([job], .unavailable(.invalidState, detail: detail)), true
            )
        }
        if message.hasPrefix("VERSIONEXHAUSTED ") {
            let detail = String(message.dropFirst("VERSIONEXHAUSTED ".count))
            let line = "a change was refused (\(detail)): \(TokenState.versionExhausted); the key is \(stateKey)"
            return (
                [
                    .countError, .log(key: "writer.version_exhausted", .error, line),
                    .link(.versionSeen(atMaximum: true)),
                ] + fail([job], .versionExhausted), true
            )
        }
        if let connectionError = RedisConnectionError.classify(errorReply: message) {
            let health = RedisLinkStateMachine.Health(connectionError)
            return (
                [
                    .countError,
                    .log(key: "writer.refused", .warning, "Redis refused a write: \(connectionError); reconnecting"),
                ] + fail([job], .unavailable(health, detail: connectionError.description)), false
            )
        }
        return (
            [
                .countError, .log(key: "writer.script_failed", .error, "Redis script failed: \(message.prefix(200))"),
            ] + fail([job], .unavailable(.unreachable, detail: "the script failed")), true
        )
    }
}

extension RedisWriterStateMachine.Action: Equatable where Job: Equatable {}

extension RedisLinkStateMachine.Health {
    /// The reason of a write's `.unavailable` outcome when the link's health is this one.
    var unavailableReason: String { "Redis: \(rawValue)" }
}

extension RedisJobQueue.Job: RedisWriterJob {
    /// What kind of work it is: a change carries when it was queued.
    var writerKind: RedisWriterJobKind {
        switch self {
        case .change(_, let answer): .change(enqueued: answer.enqueued)
        case .check: .check
        case .probe(let sequence): .probe(sequence: sequence)
        }
    }
}

import ForgePushToken
import ForgePushTokenOwner
import ForgePushTokenTestSupport
import ServerSupport
import Testing

@testable import RedisTokenStore

/// Issue 43: the writer's reply handling (`RedisWriterStateMachine`) as a value: what each reply
/// means, what it logs, counts and tells the link's machine, what outcome each job gets, and when
/// the connection is made again, checked action by action with no Redis and no thread.
@Suite struct WriterStateMachineTests {
    /// A job of the tests: an id and a kind.
    struct Job: RedisWriterJob, Equatable {
        var id: Int
        var writerKind: RedisWriterJobKind
    }

    typealias Machine = RedisWriterStateMachine<Job>

    private static let change = Job(id: 1, writerKind: .change(enqueued: 100))
    private static let check = Job(id: 2, writerKind: .check)
    private static let probe = Job(id: 3, writerKind: .probe(sequence: 7))
    private static let stateKey = "fpt:state"

    private static func machine(_ jobs: [Job]) -> Machine {
        Machine(jobs, writeTimeout: 2, stateKey: stateKey)
    }

    /// The change script's reply: `changed`, the version and token after it, the reconciliation
    /// and the version before it (empty: the key was missing).
    private static func scriptReply(
        changed: Bool, version: UInt64, token: String, reconciled: String = "none", previous: String = ""
    ) -> RedisReply {
        .array([
            .integer(changed ? 1 : 0), .bulk(Array(String(version).utf8)), .bulk(Array(token.utf8)),
            .bulk(Array(reconciled.utf8)), .bulk(Array(previous.utf8)),
        ])
    }

    @Test func anAppliedChangeAnswersItsJobAndRecordsTheRoundTrip() {
        var machine = Self.machine([Self.change])
        let state = TokenState(version: 4, token: "aa")
        let actions = machine.replied(
            Self.scriptReply(changed: true, version: 4, token: "aa", previous: "3"), at: 100.25)
        #expect(
            actions == [
                .replied, .link(.versionSeen(atMaximum: false)), .recordWrite(seconds: 0.25),
                .committed(Self.change, .applied(state), state: state),
            ])
        #expect(machine.roundDone && machine.keep)
        #expect(machine.nextRound().isEmpty)
    }

    @Test func anUnchangedChangeAndACheckAnswerWithTheStateRead() {
        var machine = Self.machine([Self.change, Self.check])
        let state = TokenState(version: 4, token: "aa")
        let first = machine.replied(Self.scriptReply(changed: false, version: 4, token: "aa", previous: "4"), at: 101)
        #expect(
            first == [
                .replied, .link(.versionSeen(atMaximum: false)), .recordWrite(seconds: 1),
                .committed(Self.change, .unchanged(state), state: state),
            ])
        // Only the batch's first reply tells the link that the writer was answered.
        let second = machine.replied(Self.scriptReply(changed: false, version: 4, token: "aa", previous: "4"), at: 101)
        #expect(
            second == [.link(.versionSeen(atMaximum: false)), .learned(state), .link(.checkSucceeded(read: state))])
    }

    @Test func aReconciliationIsLoggedUnderItsOwnKey() {
        var written = Self.machine([Self.check])
        let state = TokenState(version: 4, token: "aa")
        let actions = written.replied(
            Self.scriptReply(changed: false, version: 4, token: "aa", reconciled: "written"), at: 1)
        #expect(
            actions == [
                .replied, .link(.versionSeen(atMaximum: false)),
                .log(
                    key: "writer.written_back", .warning,
                    "Redis had lost the state (a missing key); wrote back this replica's \(state)"),
                .learned(state), .link(.checkSucceeded(read: state)),
            ])
        var bumped = Self.machine([Self.check])
        let bumpedActions = bumped.replied(
            Self.scriptReply(changed: true, version: 5, token: "bb", reconciled: "bumped", previous: "4"), at: 1)
        guard bumpedActions.count > 2, case .log(let key, .warning, _) = bumpedActions[2] else {
            Issue.record("no log line for a bumped state: \(bumpedActions)")
            return
        }
        #expect(key == "writer.bumped")
    }

    @Test func aVersionAtTheMaximumIsReported() {
        var machine = Self.machine([Self.check])
        let top = RedisCodec.maximumVersion
        let actions = machine.replied(Self.scriptReply(changed: false, version: top, token: "aa"), at: 1)
        #expect(actions.contains(.link(.versionSeen(atMaximum: true))))
    }

    /// The script's own refusals keep the connection; the job gets the outcome they mean.
    @Test func theScriptsRefusalsFailTheJobAndKeepTheConnection() {
        var invalid = Self.machine([Self.change])
        #expect(
            invalid.replied(.error("INVALIDSTATE the token field is bad"), at: 1) == [
                .replied, .countError, .link(.invalidState(detail: "the token field is bad")),
                .answer(Self.change, .unavailable(reason: "Redis: invalid_state")),
            ])
        #expect(invalid.keep)

        var exhausted = Self.machine([Self.change])
        #expect(
            exhausted.replied(.error("VERSIONEXHAUSTED at 9007199254740991"), at: 1) == [
                .replied, .countError,
                .log(
                    key: "writer.version_exhausted", .error,
                    "a change was refused (at 9007199254740991): \(TokenState.versionExhausted); the key is fpt:state"),
                .link(.versionSeen(atMaximum: true)), .answer(Self.change, .versionExhausted),
            ])
        #expect(exhausted.keep)

        var failedScript = Self.machine([Self.check])
        #expect(
            failedScript.replied(.error("ERR something odd"), at: 1) == [
                .replied, .countError,
                .log(key: "writer.script_failed", .error, "Redis script failed: ERR something odd"),
                .link(.checkFailed(.unreachable, detail: "the script failed")),
            ])
        #expect(failedScript.keep)
    }

    /// A refusal of the connection's (`READONLY`, `NOAUTH`) fails the job and makes the
    /// connection again; the next job of the batch still gets its own reply.
    @Test func aConnectionRefusalReconnects() {
        var machine = Self.machine([Self.change, Self.check])
        let actions = machine.replied(.error("NOAUTH Authentication required."), at: 1)
        #expect(
            actions == [
                .replied, .countError,
                .log(
                    key: "writer.refused", .warning,
                    "Redis refused a write: \(RedisConnectionError.authFailed("NOAUTH Authentication required.")); reconnecting"
                ),
                .answer(Self.change, .unavailable(reason: "Redis: auth_failed")),
            ])
        #expect(!machine.keep && !machine.roundDone)
        let state = TokenState(version: 1, token: "aa")
        #expect(
            machine.replied(Self.scriptReply(changed: false, version: 1, token: "aa"), at: 1)
                == [.link(.versionSeen(atMaximum: false)), .learned(state), .link(.checkSucceeded(read: state))])
        #expect(!machine.keep)
    }

    @Test func anUnreadableScriptReplyIsAnInvalidState() {
        var machine = Self.machine([Self.change])
        let actions = machine.replied(.status("OK"), at: 1)
        #expect(
            actions == [
                .replied, .countError,
                .log(key: "writer.reply", .error, "Redis script reply not understood: unexpected script reply"),
                .link(.invalidState(detail: "unexpected script reply")),
                .answer(Self.change, .unavailable(reason: "Redis: invalid_state")),
            ])
        #expect(machine.keep)
    }

    /// A probe's `PUBLISH` answer is its delivery count: nothing to do; an error counts it as not
    /// sent, and only a connection's refusal reconnects.
    @Test func aProbesReplies() {
        var delivered = Self.machine([Self.probe])
        #expect(delivered.replied(.integer(2), at: 1) == [.replied])
        var refused = Self.machine([Self.probe])
        #expect(
            refused.replied(.error("ERR nope"), at: 1) == [
                .replied, .countError,
                .log(key: "writer.probe_refused", .warning, "Redis refused the delivery probe: ERR nope"),
                .probeNotSent(sequence: 7),
            ])
        #expect(refused.keep)
        var readOnly = Self.machine([Self.probe])
        _ = readOnly.replied(.error("READONLY You can't write against a read only replica."), at: 1)
        #expect(!readOnly.keep)
    }

    /// `NOSCRIPT` decides nothing yet: the job goes again as `EVAL` (`RedisBatch`).
    @Test func noScriptWaitsForTheEVALRound() {
        var machine = Self.machine([Self.change])
        #expect(machine.replied(.error("NOSCRIPT No matching script."), at: 1) == [.replied])
        #expect(machine.roundDone)
        #expect(machine.nextRound() == [Self.change])
        #expect(machine.round == .source)
    }

    /// A connection reused from an earlier batch that fails before any reply (not a timeout): the
    /// whole batch is sent again on a new one, and nothing else happens.
    @Test func aBrokenIdleConnectionSendsTheBatchAgain() {
        var machine = Self.machine([Self.change, Self.check])
        guard case .retry(let again) = machine.failed(.unreachable("reset"), mayRetry: true) else {
            Issue.record("a broken idle connection did not send the batch again")
            return
        }
        #expect(again == [Self.change, Self.check])
    }

    /// A timeout is never sent again (the write may be applied): every job without a reply fails
    /// as `.unknown`, and the state is read again soon, after the jobs' outcomes.
    @Test func aTimeoutFailsEveryJobLeftAndAsksForARead() {
        var machine = Self.machine([Self.change, Self.check, Self.probe])
        _ = machine.replied(.error("NOSCRIPT No matching script."), at: 1)
        let error = RedisConnectionError.timedOut
        guard case .fail(let actions) = machine.failed(error, mayRetry: true) else {
            Issue.record("a timeout sent the batch again")
            return
        }
        #expect(
            actions == [
                .countError, .link(.writerFailed(.unreachable, detail: error.description)),
                .log(key: "writer.timeout", .warning, "Redis did not answer within 2.0 s; reconnecting"),
                .link(.checkFailed(.unreachable, detail: error.description)), .probeNotSent(sequence: 7),
                .answer(Self.change, .unknown(reason: "Redis did not answer the write in time")),
                .link(.refreshRequested),
            ])
        #expect(!machine.keep)
    }

    /// An oversized reply is counted as ignored and named in the log, then fails like any break.
    @Test func anOversizedReplyIsNamed() {
        var machine = Self.machine([Self.check])
        _ = machine.replied(.error("NOSCRIPT No matching script."), at: 1)
        _ = machine.nextRound()
        let error = RedisConnectionError.replyTooLarge("a bulk string of 600 MB")
        guard case .fail(let actions) = machine.failed(error, mayRetry: true) else {
            Issue.record("a failure after a reply sent the batch again")
            return
        }
        #expect(
            actions == [
                .countError, .oversized(detail: "Redis sent the writer \(error); reconnecting"),
                .link(.writerFailed(.unreachable, detail: error.description)),
                .link(.checkFailed(.unreachable, detail: error.description)),
            ])
    }

    /// The writer's failures before sending (a failed connect, a stopping replica): each kind of
    /// job ends the way the failure means, and only an unknown change asks for a read.
    @Test func jobsFailedBeforeSending() {
        let stopping = Machine.fail(
            [Self.change, Self.check, Self.probe], .unavailable(.unreachable, detail: "the replica is stopping"))
        #expect(
            stopping == [
                .answer(Self.change, .unavailable(reason: "Redis: unreachable")),
                .link(.checkFailed(.unreachable, detail: "the replica is stopping")), .probeNotSent(sequence: 7),
            ])
        let error = RedisConnectionError.authFailed("WRONGPASS")
        #expect(
            Machine.connectionFailed(error) == [
                .countError, .link(.writerFailed(.authFailed, detail: error.description)),
            ])
        #expect(
            Machine.fail([Self.check], .unknown(detail: "late")) == [.link(.checkFailed(.unreachable, detail: "late"))])
    }

    /// Every job of a batch gets exactly one outcome (an answer, a check's end, a probe's end),
    /// over a seeded random run of replies of every kind and a failure at any step or none.
    @Test func everyJobEndsExactlyOnce() {
        var generator = SeededGenerator(state: 43)
        let replies: [RedisReply] = [
            Self.scriptReply(changed: true, version: 2, token: "aa", previous: "1"), .error("NOSCRIPT x"),
            .error("INVALIDSTATE x"), .error("READONLY x"), .error("ERR x"), .status("OK"), .integer(1),
        ]
        for _ in 0..<2000 {
            let count = Int.random(in: 1...8, using: &generator)
            let jobs = (0..<count).map { id in
                Job(id: id, writerKind: [.change(enqueued: 0), .check, .probe(sequence: UInt64(id))][id % 3])
            }
            var machine = Self.machine(jobs)
            var ended: [Int] = []
            func record(_ actions: [Machine.Action]) {
                for action in actions {
                    switch action {
                    case .answer(let job, _), .committed(let job, _, _): ended.append(job.id)
                    case .link(.checkSucceeded), .link(.checkFailed):
                        ended.append(jobs.first { $0.writerKind == .check && !ended.contains($0.id) }?.id ?? -1)
                    case .probeNotSent(let sequence): ended.append(Int(sequence))
                    default: break
                    }
                }
            }
            let failAt = Int.random(in: 0...(2 * count + 1), using: &generator)
            var step = 0
            var round = jobs
            outer: while !round.isEmpty {
                while !machine.roundDone {
                    if step == failAt {
                        if case .fail(let actions) = machine.failed(.timedOut, mayRetry: false) { record(actions) }
                        break outer
                    }
                    step += 1
                    let job = machine.batch.sent[machine.batch.read]
                    let reply = replies.randomElement(using: &generator)!
                    let actions = machine.replied(reply, at: 1)
                    record(actions)
                    // A probe answered with anything but an error is delivered: its end is the
                    // subscription's (it hears it), not the writer's.
                    if case .probe = job.writerKind, reply.errorCode == nil { ended.append(job.id) }
                }
                round = machine.nextRound()
            }
            #expect(ended.sorted() == Array(0..<count), "\(count) jobs, failing at step \(failAt): \(ended)")
        }
    }
}

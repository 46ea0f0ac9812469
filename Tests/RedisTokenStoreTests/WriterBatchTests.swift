import Dispatch
import ForgePushToken
import ForgePushTokenOwner
import ForgePushTokenTestSupport
import ServerSupport
import Testing

@testable import RedisTokenStore

/// Issue 42, finding 1: the writer's decision on a batch's replies (`RedisBatch`), as a value.
/// Every job of a batch ends exactly once, completed by a reply or handed back to be failed,
/// whatever step fails; in particular a `NOSCRIPT` followed by a failing `EVAL` fails every job
/// that was still waiting, instead of dropping them.
@Suite struct WriterBatchTests {
    // Computed, not stored: a stored static's enum payload keeps its box behind a tagged pointer
    // that LeakSanitizer cannot follow, so the Address Sanitizer run reported it as leaked.
    private static var ok: RedisReply { .status("OK") }
    private static var noScript: RedisReply { .error("NOSCRIPT No matching script. Please use EVAL.") }

    /// The jobs a decision completed.
    private static func completed(_ decision: RedisBatch<Int>.Decision) -> Int? {
        if case .complete(let job, _) = decision { return job }
        return nil
    }

    @Test func everyReplyCompletesItsJobInOrder() {
        var batch = RedisBatch([1, 2, 3])
        #expect(!batch.roundDone && !batch.anyReply)
        #expect([1, 2, 3].map { _ in Self.completed(batch.replied(Self.ok)) } == [1, 2, 3])
        #expect(batch.roundDone && batch.anyReply)
        #expect(batch.nextRound().isEmpty)
        #expect(batch.failed().isEmpty)
    }

    @Test func noScriptSendsThoseJobsAgainAsEVAL() {
        var batch = RedisBatch([1, 2, 3])
        #expect(Self.completed(batch.replied(Self.noScript)) == nil)
        #expect(Self.completed(batch.replied(Self.ok)) == 2)
        #expect(Self.completed(batch.replied(Self.noScript)) == nil)
        #expect(batch.round == .cached)
        #expect(batch.nextRound() == [1, 3])
        #expect(batch.round == .source)
        #expect(Self.completed(batch.replied(Self.ok)) == 1)
        // EVAL carries the script: a NOSCRIPT there is the job's answer, never a third round.
        guard case .complete(3, let reply) = batch.replied(Self.noScript) else {
            Issue.record("NOSCRIPT in the EVAL round did not complete its job")
            return
        }
        #expect(reply == Self.noScript)
        #expect(batch.nextRound().isEmpty)
    }

    /// The finding itself: `NOSCRIPT` for the whole batch, then the first `EVAL` fails (a stall
    /// past the write timeout, a reset): every job of the round is handed back to be failed.
    @Test func aFailedEVALAfterNOSCRIPTFailsEveryJobLeft() {
        var batch = RedisBatch([1, 2, 3])
        for _ in 0..<3 { _ = batch.replied(Self.noScript) }
        #expect(batch.nextRound() == [1, 2, 3])
        #expect(batch.failed() == [1, 2, 3])
        // And when the EVAL round had answered one already.
        var again = RedisBatch([1, 2, 3])
        for _ in 0..<3 { _ = again.replied(Self.noScript) }
        _ = again.nextRound()
        #expect(Self.completed(again.replied(Self.ok)) == 1)
        #expect(again.failed() == [2, 3])
    }

    /// A failure in the `EVALSHA` round after a `NOSCRIPT`: the jobs set aside for `EVAL` are
    /// handed back with the rest of the round.
    @Test func aFailureInTheFirstRoundFailsTheJobsSetAsideToo() {
        var batch = RedisBatch([1, 2, 3, 4])
        #expect(Self.completed(batch.replied(Self.noScript)) == nil)
        #expect(Self.completed(batch.replied(Self.ok)) == 2)
        #expect(batch.failed() == [3, 4, 1])
        #expect(batch.failed().isEmpty)
    }

    /// Every job ends exactly once, over every reply sequence of a seeded random run: replies
    /// `OK` or `NOSCRIPT`, and a failure at any step of either round or none.
    @Test func everyJobEndsExactlyOnce() {
        var generator = SeededGenerator(state: 42)
        for _ in 0..<2000 {
            let count = Int.random(in: 1...8, using: &generator)
            var batch = RedisBatch(Array(0..<count))
            var ended: [Int] = []
            let failAt = Int.random(in: 0...(2 * count + 1), using: &generator)
            var step = 0
            var round = batch.jobs
            outer: while !round.isEmpty {
                while !batch.roundDone {
                    if step == failAt {
                        ended += batch.failed()
                        break outer
                    }
                    step += 1
                    let reply = Bool.random(using: &generator) ? Self.ok : Self.noScript
                    if let job = Self.completed(batch.replied(reply)) { ended.append(job) }
                }
                round = batch.nextRound()
            }
            #expect(ended.sorted() == Array(0..<count), "\(count) jobs, failing at step \(failAt): \(ended)")
        }
    }
}

/// Issue 42, finding 3: a write is answered within the write timeout of being queued, by the
/// writer or, failing it, by `RedisWriteDeadlines`; never twice.
@Suite struct WriteDeadlineTests {
    @Test func anAnswerIsGivenOnce() {
        let outcomes = Locked<[CommitOutcome]>([])
        let answer = RedisWriteAnswer(enqueued: 10, timeout: 2) { outcome in outcomes.withLock { $0.append(outcome) } }
        #expect(answer.deadline == 12 && !answer.isGiven)
        #expect(answer.give(.unknown(reason: "late")))
        #expect(!answer.give(.applied(TokenState(version: 1, token: "aa"))))
        #expect(answer.isGiven)
        #expect(outcomes.withLock { $0 } == [.unknown(reason: "late")])
    }

    /// A write nobody answers gets `.unknown` at its deadline; one answered before is left alone;
    /// the thread ends after `stop()` once every tracked write has its answer. On a manual clock:
    /// the deadline passes when the test moves the time, and nothing here sleeps.
    @Test func unansweredWritesAreAnsweredAtTheirDeadline() {
        let clock = ManualServerClock()
        let deadlines = RedisWriteDeadlines(clock: .manual(clock))
        let ended = DispatchSemaphore(value: 0)
        let expiries = Locked(0)
        DispatchQueue(label: "deadlines-test").async {
            deadlines.run { expiries.withLock { $0 += 1 } }
            ended.signal()
        }
        let outcomes = Locked<[String: CommitOutcome]>([:])
        func answer(_ name: String, timeout: Double) -> RedisWriteAnswer {
            RedisWriteAnswer(enqueued: monotonicSeconds(on: .manual(clock)), timeout: timeout) { outcome in
                outcomes.withLock { $0[name] = outcome }
            }
        }
        let answered = answer("answered", timeout: 2)
        let silent = answer("silent", timeout: 2)
        let later = answer("later", timeout: 3600)
        for tracked in [answered, silent, later] { deadlines.track(tracked) }
        #expect(answered.give(.applied(TokenState(version: 1, token: "aa"))))
        // The thread has seen the writes and sleeps; their deadline has not come: none is answered.
        // (`advance(by: 0)` ends its wait: the wait after it is one decided after the writes.)
        let tracked = clock.waitsBegun
        clock.advance(by: .zero)
        waitUntil("the deadline thread to sleep after the writes were tracked") { clock.isWaiting(after: tracked) }
        #expect(!silent.isGiven && !later.isGiven && expiries.withLock { $0 } == 0)
        clock.advance(by: .milliseconds(1900))
        let early = clock.waitsBegun
        clock.advance(by: .zero)
        waitUntil("the deadline thread to sleep again at 1.9 s") { clock.isWaiting(after: early) }
        #expect(!silent.isGiven, "a write was answered before its deadline")
        // The deadline, and a microsecond: the seconds are `Double`s near 10^6, rounded.
        clock.advance(by: .microseconds(100_001))
        waitUntil(#"outcomes.withLock { $0["silent"] } != nil"#) { outcomes.withLock { $0["silent"] } != nil }
        #expect(outcomes.withLock { $0["silent"] } == .unknown(reason: "Redis did not answer the write in time"))
        #expect(outcomes.withLock { $0["answered"] } == .applied(TokenState(version: 1, token: "aa")))
        #expect(!later.isGiven)
        // The store reads the state again after a write it answered at its deadline.
        waitUntil(#"expiries.withLock { $0 } == 1"#) { expiries.withLock { $0 } == 1 }
        deadlines.stop()
        // Still one write to answer: the thread, having seen the stop, sleeps instead of ending.
        let stopped = clock.waitsBegun
        clock.advance(by: .zero)
        waitUntil("the deadline thread to sleep after stop()") { clock.isWaiting(after: stopped) }
        #expect(ended.wait(timeout: .now()) == .timedOut, "the deadline thread ended with a write unanswered")
        #expect(later.give(.unavailable(reason: "Redis: unreachable")))
        // Its next look (every 0.5 s of its clock) finds nothing left.
        clock.advance(by: .milliseconds(500))
        #expect(
            ended.wait(timeout: .now() + waitBoundSeconds) == .success, "the deadline thread did not end after stop()")
        // `later` was answered by its writer, not at its deadline: no second check.
        #expect(expiries.withLock { $0 } == 1)
    }
}

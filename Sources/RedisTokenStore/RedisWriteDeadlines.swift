import Dispatch
import ForgePushToken
import ForgePushTokenOwner
import ServerSupport
import Synchronization

/// One write's answer, given once: by the writer when Redis answers or fails, or by
/// `RedisWriteDeadlines` when the write timeout passed since the write was queued, whichever comes
/// first (docs/replicas.md, "When something fails": a write Redis does not answer within 2 s of
/// its body completing gets `503 store_unavailable`; the time in the queue, the writer's reconnect
/// and its `SCRIPT LOAD` count).
///
/// Thread-safety: `give` may be called from any thread, any number of times; the completion runs
/// once, on the thread of the call that won, with no lock held. Lock-free (an atomic flag), so it
/// adds no lock to docs/architecture.md's list.
final class RedisWriteAnswer: Sendable {
    /// When the write was queued, in monotonic seconds (`monotonicSeconds()`).
    let enqueued: Double
    /// When it is answered `.unknown` if nothing answered it before, in monotonic seconds.
    let deadline: Double
    private let completion: @Sendable (CommitOutcome) -> Void
    private let given = Atomic<Bool>(false)

    /// An answer for a write queued at `enqueued`, due `timeout` seconds later, given to
    /// `completion`.
    init(enqueued: Double, timeout: Double, completion: @escaping @Sendable (CommitOutcome) -> Void) {
        self.enqueued = enqueued
        self.deadline = enqueued + timeout
        self.completion = completion
    }

    /// Gives `outcome` unless an answer was given already; returns whether this call gave it.
    @discardableResult
    func give(_ outcome: CommitOutcome) -> Bool {
        guard given.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged
        else { return false }
        completion(outcome)
        return true
    }

    /// Whether an answer was given.
    var isGiven: Bool { given.load(ordering: .acquiring) }
}

/// The store's write deadlines: a thread that answers every write still unanswered at its
/// deadline (`RedisWriteAnswer.deadline`) with `.unknown` (503 `store_unavailable`, Retry-After:
/// the write may or may not have been applied), wherever the writer is: in a connect, an `AUTH`, a
/// `SCRIPT LOAD`, a read, or a sentinel's answer. The writer does not send a write already
/// answered, and a reply that comes after its answer still tells the owner the state Redis holds
/// (`RedisLink.learned`).
///
/// Writes are tracked in the order queued, so their deadlines are in order too (to within the
/// microseconds two request threads race by): the thread sleeps until the oldest unanswered one.
///
/// Its time comes from a `ServerClock` (`RedisTokenStore.Configuration.clock`): the monotonic
/// clock and Dispatch's timed waits, or a test's manual clock, which moves only when the test says,
/// so that no test sleeps for a deadline to pass (WriterBatchTests).
///
/// Thread-safety: `track` and `stop` may be called from any thread; `run` once, on the thread
/// it owns. One lock, `state` (a leaf: nothing is called under it; the answers are given after it
/// is released).
final class RedisWriteDeadlines: Sendable {
    /// The tracked answers from `head` on (those before it are done), and whether the store stops.
    private let state = Locked<(answers: [RedisWriteAnswer], head: Int, stopped: Bool)>(([], 0, false))
    /// Signalled when the first answer is tracked into an empty list, and at stop.
    private let signal = DispatchSemaphore(value: 0)

    /// The time the deadlines are measured and waited on.
    let clock: ServerClock

    /// Deadlines for a store, on `clock`; nothing runs until `run()`.
    init(clock: ServerClock = .monotonic) {
        self.clock = clock
    }

    /// Tracks `answer` until it is given.
    func track(_ answer: RedisWriteAnswer) {
        let first = state.withLock { state -> Bool in
            state.answers.append(answer)
            return state.answers.count - state.head == 1
        }
        if first { signal.signal() }
    }

    /// What is due at `now`: the answers to give `.unknown` now, and how long to sleep (`nil`: none
    /// is tracked; with `stopped` set as well, the thread ends).
    private func due(at now: Double) -> (due: [RedisWriteAnswer], sleep: Double?, stopped: Bool) {
        state.withLock { state in
            var due: [RedisWriteAnswer] = []
            while state.head < state.answers.count {
                let answer = state.answers[state.head]
                if !answer.isGiven {
                    guard answer.deadline <= now else { break }
                    due.append(answer)
                }
                state.head += 1
            }
            if state.head == state.answers.count {
                state.answers.removeAll(keepingCapacity: state.answers.count <= 4096)
                state.head = 0
                return (due, nil, state.stopped)
            }
            if state.head >= 1024, state.head * 2 >= state.answers.count {
                state.answers.removeFirst(state.head)
                state.head = 0
            }
            return (due, state.answers[state.head].deadline - now, false)
        }
    }

    /// Answers writes at their deadlines until `stop()` was called and none is left (at most the
    /// write timeout after the stop); calls `expired` after answering any (such a write may still
    /// be applied: the store reads the state again soon).
    func run(expired: () -> Void = {}) {
        while true {
            let (due, sleep, stopped) = due(at: monotonicSeconds(on: clock))
            var answered = false
            for answer in due where answer.give(.unknown(reason: "Redis did not answer the write in time")) {
                answered = true
            }
            if answered { expired() }
            if sleep == nil, stopped { return }
            clock.wait(on: signal, for: .seconds(min(max(sleep ?? 0.5, 0.001), 0.5)))
        }
    }

    /// Ends `run()` once every tracked answer is given.
    func stop() {
        state.withLock { $0.stopped = true }
        signal.signal()
    }
}

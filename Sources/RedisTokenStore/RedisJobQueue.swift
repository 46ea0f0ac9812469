import Dispatch
import ForgePushToken
import ForgePushTokenOwner

/// The writer's bounded queue of work: commits and checks of `PREFIX:state`.
///
/// Thread-safety: all members may be called from any thread; `take` from the writer's alone.
final class RedisJobQueue: Sendable {
    /// One piece of work.
    enum Job: Sendable {
        /// Propose `token`; `answer` gets the outcome once (from the writer, or from
        /// `RedisWriteDeadlines` at the write's deadline).
        case change(token: String?, answer: RedisWriteAnswer)
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

    /// How many changes (`Job.change`) wait for the writer: the event a test waits for to know
    /// that the writer took one (LiveRedisTests).
    var changeCount: Int {
        state.withLock { state in
            state.jobs.count { if case .change = $0 { true } else { false } }
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

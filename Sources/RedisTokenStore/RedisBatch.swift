/// What the writer does with the replies to one pipelined batch, decided as a value (the writer
/// sends and reads; this decides): which job a reply completes, which jobs are sent again as
/// `EVAL` after a `NOSCRIPT` (the script cache was flushed: an operator's `SCRIPT FLUSH`, a Redis
/// restarted behind a proxy that kept the connection), and which jobs a broken or silent
/// connection leaves without a reply.
///
/// Every job of the batch ends exactly once: completed by its reply (`replied`), or handed back by
/// `failed()` to be failed by the writer. Nothing is dropped whatever the step that fails: a
/// failure in the `EVAL` round hands back the jobs still waiting in it, and a failure in the
/// `EVALSHA` round hands back the ones that `NOSCRIPT` set aside as well (docs/replicas.md,
/// "What lives in Redis").
///
/// Rounds: `cached` (every job as `EVALSHA`, or `PUBLISH` for a probe), then, when any reply was
/// `NOSCRIPT`, one `source` round of those jobs as `EVAL`. A `NOSCRIPT` in the `source` round
/// (which no Redis sends: `EVAL` carries the script) completes the job with that error.
///
/// Thread-safety: a value; the writer's thread alone uses each batch.
struct RedisBatch<Job> {
    /// The command a round sends for each job.
    enum Round: Equatable, Sendable {
        /// `EVALSHA` with the loaded scripts' hashes.
        case cached
        /// `EVAL` with the scripts' source, after `NOSCRIPT`.
        case source
    }

    /// What a reply decided.
    enum Decision {
        /// `reply` is the job's answer: complete it.
        case complete(Job, RedisReply)
        /// The job is sent again in the `source` round: nothing to do now.
        case resend
    }

    /// Every job of the batch, in the order sent first.
    let jobs: [Job]
    /// The round in flight.
    private(set) var round: Round = .cached
    /// The jobs sent in this round, answered in this order.
    private(set) var sent: [Job]
    /// How many replies of this round were read.
    private(set) var read = 0
    /// The jobs answered `NOSCRIPT` in the `cached` round, for the `source` round.
    private(set) var setAside: [Job] = []
    /// Whether any reply of the batch was read (a connection that fails before it may have sat idle
    /// with a broken socket: the writer may send the whole batch again on a new one).
    private(set) var anyReply = false

    /// A batch of `jobs`, all sent in the `cached` round.
    init(_ jobs: [Job]) {
        self.jobs = jobs
        self.sent = jobs
    }

    /// Whether every reply of the round in flight was read.
    var roundDone: Bool { read >= sent.count }

    /// The next reply of the round in flight arrived: what to do with it. Call only while
    /// `roundDone` is false.
    mutating func replied(_ reply: RedisReply) -> Decision {
        precondition(!roundDone, "a reply beyond the round's commands")
        let job = sent[read]
        read += 1
        anyReply = true
        if round == .cached, reply.errorCode == "NOSCRIPT" {
            setAside.append(job)
            return .resend
        }
        return .complete(job, reply)
    }

    /// Once `roundDone`: the jobs to send as `EVAL` in the `source` round (which starts now), or
    /// an empty list when the batch is done.
    mutating func nextRound() -> [Job] {
        precondition(roundDone, "the round in flight is not done")
        guard round == .cached, !setAside.isEmpty else {
            sent = []
            read = 0
            return []
        }
        round = .source
        sent = setAside
        setAside = []
        read = 0
        return sent
    }

    /// The connection failed (a reset, a timeout, an unreadable reply): every job that has no
    /// answer yet, in the order sent (the rest of the round in flight, then those set aside for
    /// `EVAL`), for the writer to fail. The batch is done after it.
    mutating func failed() -> [Job] {
        let left = Array(sent[min(read, sent.count)...]) + setAside
        sent = []
        read = 0
        setAside = []
        return left
    }
}

import CLinuxEvents
import CMicroHTTPD
import Dispatch
import ForgePushToken
import ServerSupport
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// The thread that runs one libmicrohttpd daemon: waits on the daemon's epoll set and on its own
/// wake-up signal, lets the daemon do all the work that is ready (`MHD_run`), and again.
///
/// Why not libmicrohttpd's own polling thread (`MHD_USE_INTERNAL_POLLING_THREAD`): libmicrohttpd
/// 0.9.75 (Debian 12) drains its epoll set in rounds of 128 events, and when a round is exactly 128
/// it waits again **with the full timeout**, which is "forever" when no connection has a timeout
/// (ours have none: event streams are long-lived). So when 128 or more sockets become ready at once
/// (say 256 subscribers connecting together), the thread blocks with the requests it has just
/// read still unanswered, until some other socket event happens to wake it: the bench's fan-out
/// client, which waits for every subscriber's first event before doing anything else, hung in
/// half of its runs (src/microhttpd/daemon.c, `MHD_epoll`, the `while (MAX_EVENTS == num_events)`
/// loop). Driven from outside, `MHD_run` never blocks (it passes a zero timeout to every
/// `epoll_wait`), and this loop blocks only when the daemon says it has no work left
/// (`MHD_get_timeout`).
///
/// Resuming: in this mode libmicrohttpd has no inter-thread channel, so `MHD_resume_connection`
/// only marks the connection; whoever resumes one then calls `wake()`. Wake-ups are coalesced: the
/// first since the loop last ran the daemon writes the eventfd, the others only see the flag. So a
/// publish that resumes 10,000 subscribers costs one system call, not one per subscriber (as
/// libmicrohttpd's own thread did, whose channel every resume wrote to).
///
/// Each daemon run is a `WakeBatch`: the loops that the run's work resumes connections of (a
/// publish resumes the subscribers of every daemon) are woken once each when it returns, and a
/// delivery on another thread (the Redis link's, the state file's) is a batch of its own
/// (`TokenOwner.deliver`). Woken at the first resume, another daemon's thread would walk all its
/// suspended connections (libmicrohttpd walks the whole list on each resume round, under the lock
/// that `MHD_resume_connection` needs) again and again while the delivery went on; woken after
/// it, each daemon walks once and the threads send in parallel.
///
/// Thread-safety: `start(daemon:)` once, then `stop()` once; `wake()` from any thread.
final class DaemonLoop: BatchWakeable {
    private let signal: Int32
    /// Whether a wake-up is written and the loop has not run the daemon since: an atomic, read
    /// before it is written, because a publish wakes the same loop once per subscriber.
    private let wakePending = Atomic<Bool>(false)
    private let stopping = Locked(false)
    private let finished = DispatchSemaphore(value: 0)
    /// A pending `quiesce()`: the semaphore its caller waits on, and the listening socket the
    /// daemon gave back.
    private let quiesceRequest = Locked<DispatchSemaphore?>(nil)
    private let quiescedSocket = Locked<Int32>(-1)
    /// The longest the loop waits for a socket event before running the daemon anyway, in
    /// milliseconds.
    static let maximumWait: UInt64 = 500
    /// Zero-timeout rounds without a socket event after which the loop waits 1 ms (see `run`).
    static let fruitlessRoundsBeforeBackoff = 64
    /// The longest backoff wait, in milliseconds (see `run`).
    static let maximumBackoff: Int32 = 50

    /// - Throws: `ServerError.socket` when the wake-up eventfd cannot be made.
    init() throws(ServerError) {
        signal = eventfd(0, Int32(EFD_CLOEXEC) | Int32(EFD_NONBLOCK))
        guard signal >= 0 else { throw .socket(call: "eventfd", address: "daemon loop", errno: errno) }
    }

    deinit {
        close(signal)
    }

    /// Starts the thread that runs `daemon` (started without an internal polling thread).
    /// `madeProgress` says, after each daemon run, whether a request began or ended in it (see
    /// `run`: such a run is never fruitless). `tick` runs on the loop's thread, between two daemon
    /// runs, about every `tickInterval` on `clock` (which it is given the time on).
    /// - Throws: `ServerError.socket` when the daemon reports no epoll set, or the thread cannot
    ///   be made.
    func start(
        daemon: DaemonHandle, madeProgress: @escaping @Sendable () -> Bool = { false },
        tick: @escaping @Sendable (ContinuousClock.Instant) -> Void = { _ in },
        detached: DetachedStreams? = nil, clock: ServerClock = .monotonic
    ) throws(ServerError) {
        // In epoll mode, MHD_get_fdset2 reports the daemon's epoll fd, and only it.
        var readSet = fd_set()
        var writeSet = fd_set()
        var exceptSet = fd_set()
        var maxFD: Int32 = -1
        guard MHD_get_fdset2(daemon.pointer, &readSet, &writeSet, &exceptSet, &maxFD, fdSetSize) == .YES,
            maxFD >= 0
        else {
            throw .socket(call: "MHD_get_fdset2", address: "libmicrohttpd daemon", errno: EBADF)
        }
        let epollFD = maxFD
        // A thread of its own: the loop blocks in poll(2) for the daemon's lifetime, which a
        // Dispatch work item must not do (it would hold one of Dispatch's worker threads).
        try LoopThread.detach(name: "fpt-http") { [self] in
            run(daemon, epollFD: epollFD, madeProgress: madeProgress, tick: tick, detached: detached, clock: clock)
            finished.signal()
        }
    }

    /// Makes the loop run the daemon soon: call it after `MHD_resume_connection`.
    func wake() {
        guard !wakePending.load(ordering: .relaxed) else { return }
        if !wakePending.exchange(true, ordering: .acquiringAndReleasing) { poke() }
    }

    /// Quiesces the daemon (`MHD_quiesce_daemon`: it stops accepting) on this loop's own thread,
    /// between two runs, and returns the listening socket it gave back (or -1). libmicrohttpd
    /// 0.9.75's `MHD_run` in epoll mode removes a quiesced daemon's listening socket from its epoll
    /// set itself; a quiesce from another thread while a run is in progress can make both remove
    /// it, and the second removal aborts the process ("Failed to remove listen FD from epoll set").
    func quiesce() -> Int32 {
        let done = DispatchSemaphore(value: 0)
        quiesceRequest.withLock { $0 = done }
        poke()
        done.wait()
        return quiescedSocket.withLock { $0 }
    }

    /// Ends the loop and waits for its thread; the daemon may then be stopped.
    func stop() {
        stopping.withLock { $0 = true }
        poke()
        finished.wait()
    }

    private func poke() {
        var one: UInt64 = 1
        _ = write(signal, &one, 8)
    }

    /// The least time between two runs of the loop's `tick`; as the loop wakes at least every
    /// `maximumWait`, ticks come every 250 to 500 ms (the precision of request deadlines).
    static let tickInterval: Duration = .milliseconds(250)

    private func run(
        _ daemon: DaemonHandle, epollFD: Int32, madeProgress: () -> Bool,
        tick: (ContinuousClock.Instant) -> Void, detached: DetachedStreams?, clock: ServerClock
    ) {
        // The third: the detached streams' sockets that became writable (-1, ignored by poll, without).
        var fds = [
            pollfd(fd: epollFD, events: Int16(POLLIN), revents: 0),
            pollfd(fd: signal, events: Int16(POLLIN), revents: 0),
            pollfd(fd: detached?.epoll ?? -1, events: Int16(POLLIN), revents: 0),
        ]
        var fruitlessRounds = 0
        var nextTick = clock.now + Self.tickInterval
        while true {
            // Never wait more than `maximumWait`, as a backstop: work that libmicrohttpd leaves for
            // a later round (such as freeing a closed connection) must not wait for an unrelated
            // socket event. Two idle wake-ups a second cost nothing measurable.
            var timeout: UInt64 = 0
            var wait: Int32 =
                MHD_get_timeout(daemon.pointer, &timeout) == .YES
                ? Int32(clamping: min(timeout, Self.maximumWait)) : Int32(Self.maximumWait)
            // libmicrohttpd 0.9.75 asks to be run again at once, forever, for a connection it
            // cannot advance: a chunked body whose chunk-size line does not fit in what is left of
            // the connection's memory pool (the client can send 9 KB once and leave), and every
            // run walks all such connections. After `fruitlessRoundsBeforeBackoff` rounds in a row
            // without an event and without a request beginning or ending, the loop waits instead
            // of spinning: 1 ms, doubling with every further fruitless round up to
            // `maximumBackoff`. Any socket event or wake-up still ends the wait at once (and resets
            // it), so other clients are served as before, while stuck connections cost about 20
            // runs a second until their idle timeout. Pipelined requests already in a
            // connection's buffer also make libmicrohttpd ask for a run at once without a socket
            // event, but each such run begins or ends a request (`madeProgress`), so they are
            // served without waiting (100 pipelined requests took 6.5 s when they were not).
            if wait == 0 && fruitlessRounds >= Self.fruitlessRoundsBeforeBackoff {
                let doublings = min(fruitlessRounds - Self.fruitlessRoundsBeforeBackoff, 6)
                wait = min(Self.maximumBackoff, Int32(1) << doublings)
            }
            // On a manual clock, the loop looks at the time at least every
            // `ServerClock.manualLookInterval` (its `maximumWait` is longer).
            if !clock.isMonotonic { wait = min(wait, clock.realTimeout(for: .seconds(1)).timeoutMilliseconds) }
            let ready = poll(&fds, 3, wait)
            if ready > 0 || timeout > 0 { fruitlessRounds = 0 } else { fruitlessRounds += 1 }
            if ready > 0, fds[1].revents != 0 {
                var count: UInt64 = 0
                _ = read(signal, &count, 8)
                if stopping.withLock({ $0 }) { return }
            }
            if let done = quiesceRequest.withLock({ request in
                defer { request = nil }
                return request
            }) {
                let socket = MHD_quiesce_daemon(daemon.pointer)
                quiescedSocket.withLock { $0 = socket }
                done.signal()
            }
            // Cleared before the daemon runs: a resume from now on either is seen by this run or
            // writes the eventfd again.
            wakePending.store(false, ordering: .sequentiallyConsistent)
            // The loops whose connections the run resumes are woken when it returns.
            WakeBatch.run { _ = MHD_run(daemon.pointer) }
            // Then the detached streams (handed over in this run, woken, or writable again), after
            // the batch: the other loops a publish in this run woke send to their streams while
            // this one sends to its own (inside the batch, they waited for all of this loop's sends).
            detached?.serve(writable: ready > 0 && fds[2].revents != 0)
            if madeProgress() { fruitlessRounds = 0 }
            let now = clock.now
            if now >= nextTick {
                tick(now)
                nextTick = now + Self.tickInterval
            }
        }
    }
}

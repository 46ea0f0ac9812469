import CLinuxEvents
import Dispatch
import HTTPServing
import ServerSupport

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// Watches the sockets of event-stream subscribers for a departed client, and ticks the heartbeat.
///
/// libmicrohttpd does not notice a client that closed or reset its connection while that
/// connection is suspended (its manual, "Flow control"), and a subscriber is suspended whenever it
/// has nothing to send. So each subscriber's socket is also registered, edge-triggered, for
/// `EPOLLRDHUP` (peer closed), `EPOLLHUP` and `EPOLLERR` in an epoll set of our own; when one fires
/// the application ends that stream (`HTTPTicks.clientLeft(stream:)`), which resumes its
/// connection, and libmicrohttpd closes it. A detached stream's socket (the engine's copy,
/// `DetachedStream`) is watched the same way; its end wakes its daemon's loop, which closes it. A
/// departed client is thus released within milliseconds, heartbeat or not, on both paths.
///
/// The same thread calls the application's `heartbeat()` every `heartbeatSeconds`, and
/// `tick()` (the streams' age limits, `--max-stream-age`) every `tickMilliseconds` when it wants
/// them, from its `epoll_wait` timeout: no busy loop, one thread (of its own) for every subscriber.
///
/// Thread-safety: `watch`/`unwatch` may be called from any thread (epoll_ctl is thread-safe);
/// `stop()` once, from any thread. The epoll event's data is the subscriber id, not the fd, so an
/// event that races with a removal names an id the application no longer knows and is ignored.
final class SubscriberWatcher: Sendable {
    private let epoll: Int32
    private let stopSignal: Int32
    /// The application's heartbeat, ticks and stream departures (`HTTPTicks`), or `nil` for an
    /// application without them.
    private let application: (any HTTPTicks)?
    private let heartbeatSeconds: Int
    private let ticks: Bool
    /// `ServerConfiguration.clock`: when heartbeats and ticks are due.
    private let clock: ServerClock
    private let finished = DispatchSemaphore(value: 0)
    private var stopID: UInt64 { UInt64.max }

    /// - Throws: `ServerError.socket` when the epoll set or the eventfd cannot be made.
    /// A watcher that tells `ticks` of the heartbeat every `heartbeatSeconds`, of its ticks (when
    /// `wantsTicks`) and of departed stream clients.
    init(ticks: (any HTTPTicks)?, heartbeatSeconds: Int, wantsTicks: Bool, clock: ServerClock = .monotonic)
        throws(ServerError)
    {
        self.clock = clock
        precondition(heartbeatSeconds >= 1, "heartbeat must be at least 1 second")
        self.application = ticks
        self.heartbeatSeconds = heartbeatSeconds
        self.ticks = wantsTicks && ticks != nil
        epoll = epoll_create1(Int32(EPOLL_CLOEXEC))
        guard epoll >= 0 else { throw .socket(call: "epoll_create1", address: "subscriber watcher", errno: errno) }
        stopSignal = eventfd(0, Int32(EFD_CLOEXEC))
        guard stopSignal >= 0 else {
            let code = errno
            close(epoll)
            throw .socket(call: "eventfd", address: "subscriber watcher", errno: code)
        }
        var event = epoll_event(events: EPOLLIN.rawValue, data: epoll_data_t(u64: stopID))
        epoll_ctl(epoll, EPOLL_CTL_ADD, stopSignal, &event)
    }

    deinit {
        close(stopSignal)
        close(epoll)
    }

    /// Starts the watching thread (a thread of its own: it blocks in epoll_wait(2) for the
    /// server's lifetime, which a Dispatch work item must not do).
    /// - Throws: `ServerError.socket` when the thread cannot be made.
    func start() throws(ServerError) {
        // The periods run from the start (read here, not on the new thread, so that a manual
        // clock's test that moves the time after `start()` moves it past the first period's start).
        let started = clock.now
        try LoopThread.detach(name: "fpt-watcher") { [self] in
            loop(from: started)
            finished.signal()
        }
    }

    /// Watches `fd`, the socket of subscriber `id`.
    func watch(fd: Int32, id: UInt64) {
        var event = epoll_event(
            events: EPOLLRDHUP.rawValue | EPOLLHUP.rawValue | EPOLLERR.rawValue | EPOLLET.rawValue,
            data: epoll_data_t(u64: id))
        epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &event)
    }

    /// Stops watching `fd` (before libmicrohttpd closes it).
    func unwatch(fd: Int32) {
        epoll_ctl(epoll, EPOLL_CTL_DEL, fd, nil)
    }

    /// Ends the thread and waits for it.
    func stop() {
        var one: UInt64 = 1
        _ = write(stopSignal, &one, 8)
        finished.wait()
    }

    private func loop(from started: ContinuousClock.Instant) {
        var events = [epoll_event](repeating: epoll_event(), count: 256)
        let period = Duration.seconds(heartbeatSeconds)
        var nextTick = started + period
        var nextTickOfAge = ticks ? started + .milliseconds(tickMilliseconds) : nil
        while true {
            let now = clock.now
            if now >= nextTick {
                application?.heartbeat()
                nextTick = now + period
            }
            if let second = nextTickOfAge, now >= second {
                application?.tick()
                nextTickOfAge = now + .milliseconds(tickMilliseconds)
            }
            let wait = (nextTickOfAge.map { min(nextTick, $0) } ?? nextTick) - now
            let timeout = clock.realTimeout(for: wait).timeoutMilliseconds
            let count = epoll_wait(epoll, &events, Int32(events.count), timeout)
            if count < 0 { continue }  // EINTR
            for event in events.prefix(Int(count)) {
                if event.data.u64 == stopID { return }
                application?.clientLeft(stream: event.data.u64)
            }
        }
    }
}

import CLinuxEvents
import Dispatch
import ForgePushTokenHTTP
import ForgePushTokenOwner

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
/// the owner aborts that subscriber, which resumes its connection, and libmicrohttpd closes it. A
/// departed client is thus released within milliseconds, heartbeat or not.
///
/// The same thread calls the owner's `heartbeat()` every `heartbeatSeconds`, and `everySecond`
/// (the streams' age limits, `--max-stream-age`) once a second when there is one, from its
/// `epoll_wait` timeout: no busy loop, one thread for every subscriber.
///
/// Thread-safety: `watch`/`unwatch` may be called from any thread (epoll_ctl is thread-safe);
/// `stop()` once, from any thread. The epoll event's data is the subscriber id, not the fd, so an
/// event that races with a removal names an id the owner no longer knows and is ignored.
final class SubscriberWatcher: Sendable {
    private let epoll: Int32
    private let stopSignal: Int32
    private let owner: TokenOwner<TokenSnapshot>
    private let heartbeatSeconds: Int
    private let everySecond: (@Sendable () -> Void)?
    private let finished = DispatchSemaphore(value: 0)
    private static let stopID = UInt64.max

    init(
        owner: TokenOwner<TokenSnapshot>, heartbeatSeconds: Int, everySecond: (@Sendable () -> Void)? = nil
    ) throws(ServerError) {
        precondition(heartbeatSeconds >= 1, "heartbeat must be at least 1 second")
        self.owner = owner
        self.heartbeatSeconds = heartbeatSeconds
        self.everySecond = everySecond
        epoll = epoll_create1(Int32(EPOLL_CLOEXEC))
        guard epoll >= 0 else { throw .socket(call: "epoll_create1", address: "subscriber watcher", errno: errno) }
        stopSignal = eventfd(0, Int32(EFD_CLOEXEC))
        guard stopSignal >= 0 else {
            let code = errno
            close(epoll)
            throw .socket(call: "eventfd", address: "subscriber watcher", errno: code)
        }
        var event = epoll_event(events: EPOLLIN.rawValue, data: epoll_data_t(u64: Self.stopID))
        epoll_ctl(epoll, EPOLL_CTL_ADD, stopSignal, &event)
    }

    deinit {
        close(stopSignal)
        close(epoll)
    }

    /// Starts the watching thread.
    func start() {
        DispatchQueue(label: "forge-push-token.subscriber-watcher").async { [self] in
            loop()
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

    private func loop() {
        var events = [epoll_event](repeating: epoll_event(), count: 256)
        // The service's one clock (ContinuousClock), as every deadline of the engine.
        let clock = ContinuousClock()
        let period = Duration.seconds(heartbeatSeconds)
        var nextTick = clock.now + period
        var nextSecond = everySecond == nil ? nil : clock.now + .seconds(1)
        while true {
            let now = clock.now
            if now >= nextTick {
                owner.heartbeat()
                nextTick = now + period
            }
            if let second = nextSecond, now >= second, let everySecond {
                everySecond()
                nextSecond = now + .seconds(1)
            }
            let wait = (nextSecond.map { min(nextTick, $0) } ?? nextTick) - now
            let (seconds, attoseconds) = max(wait, .zero).components
            let timeout = Int32(clamping: seconds * 1000 + attoseconds / 1_000_000_000_000_000 + 1)
            let count = epoll_wait(epoll, &events, Int32(events.count), timeout)
            if count < 0 { continue }  // EINTR
            for event in events.prefix(Int(count)) {
                if event.data.u64 == Self.stopID { return }
                owner.abort(event.data.u64)
            }
        }
    }
}

import Dispatch
import ForgePushToken

/// The server's one clock: every decision of the engine, the token service and the Redis store
/// that depends on time (a request deadline passed, a tick or heartbeat due, a stream too old or
/// stalled too long, a drain's pace, a request's duration, a Redis write's deadline) reads `now`
/// here, and every timed wait for a signal goes through `wait(on:for:)`.
///
/// Two kinds: `monotonic` (the default everywhere: `ContinuousClock.now`, Dispatch's timed
/// waits), and `manual(_:)`, over a `ServerTimeSource` that moves only when a test says (the
/// models: swift-nio's `EmbeddedEventLoop` and its `NIODeadline`, swift-async-algorithms'
/// manual clock). A loop that blocks in poll(2) or epoll_wait(2) still blocks for real time, but
/// for at most `realTimeout(for:)`: with a manual clock that is `manualLookInterval`, so a time
/// the test moves is seen within it.
///
/// Instants are `ContinuousClock.Instant`s in both kinds, so the values that hold them
/// (`RequestDeadline`, `DrainSchedule`, the detached streams) need no generic parameter; a manual
/// source starts at some real instant and moves from there.
///
/// Cost: a `ServerClock` is a plain value, one integer (0 for `monotonic`, else the number of its
/// manual source in a process-wide list that keeps each source for the process's life: tests make
/// a few dozen), so that copying it retains nothing; `now` is one test of that integer before
/// `ContinuousClock.now` (inlinable; no existential call with the monotonic clock).
///
/// Thread-safety: a plain `Sendable` value; `now` and `wait` may be called from any thread (the
/// list of manual sources is behind its own lock, taken only by manual clocks).
public struct ServerClock: Sendable, Equatable {
    /// 0 for the monotonic clock, else the manual source's place in `manualSources` plus one.
    @usableFromInline let number: Int

    /// `ContinuousClock` and Dispatch's timed waits: the server's clock outside tests.
    public static let monotonic = ServerClock(number: 0)

    /// A clock that reads `source` and waits on it (tests). Each call makes a new clock (equal to
    /// no other), and keeps `source` for the process's life.
    public static func manual(_ source: any ServerTimeSource) -> ServerClock {
        ServerClock(
            number: Self.manualSources.withLock { sources in
                sources.append(source)
                return sources.count
            })
    }

    private init(number: Int) {
        self.number = number
    }

    /// Whether this is `monotonic`.
    @inlinable public var isMonotonic: Bool { number == 0 }

    /// Now on this clock.
    @inlinable public var now: ContinuousClock.Instant {
        if number == 0 { return ContinuousClock.now }
        return manualNow()
    }

    /// The manual source's time (not inlined: tests only).
    @usableFromInline func manualNow() -> ContinuousClock.Instant {
        source.map(\.now) ?? .now
    }

    /// The manual source, or `nil` for the monotonic clock.
    private var source: (any ServerTimeSource)? {
        number == 0 ? nil : Self.manualSources.withLock { $0[number - 1] }
    }

    /// Waits until `signal` is signalled or `duration` has passed on this clock, whichever comes
    /// first. A wait may end early (a manual clock ends every wait when it moves): the caller reads
    /// the time, and whatever the signal stands for, again.
    public func wait(on signal: DispatchSemaphore, for duration: Duration) {
        if let source {
            source.wait(on: signal, for: duration)
        } else {
            _ = signal.wait(timeout: .now() + .nanoseconds(duration.nonNegativeNanoseconds))
        }
    }

    /// Lets a manual clock's source move with real time from now on (`ServerTimeSource.runFree()`:
    /// a test harness's teardown); nothing on the monotonic clock.
    public func runFree() {
        source?.runFree()
    }

    /// The real time a loop may block in poll(2) or epoll_wait(2) when its next decision is
    /// `duration` away on this clock: `duration` itself on the monotonic clock, at most
    /// `manualLookInterval` on a manual one (whose time moves without waking the loop).
    @inlinable public func realTimeout(for duration: Duration) -> Duration {
        number == 0 ? duration : min(duration, Self.manualLookInterval)
    }

    /// How often, in real time, a loop on a manual clock looks at the time again: 10 ms.
    public static let manualLookInterval: Duration = .milliseconds(10)

    /// The sources of the manual clocks made so far (`manual(_:)`), in order. A leaf lock: a
    /// source is read after it is released.
    private static let manualSources = Locked<[any ServerTimeSource]>([])
}

/// What a manual `ServerClock` reads: a time that moves only when its owner (a test) says. The
/// project's is Tests/TestSupport's `ManualServerClock`.
///
/// Thread-safety: implementations are `Sendable` classes; both members may be called from any
/// thread.
public protocol ServerTimeSource: AnyObject, Sendable {
    /// Now on this source.
    var now: ContinuousClock.Instant { get }
    /// Waits until `signal` is signalled or this source has moved `duration` past the call; may
    /// end early (every move may end every wait).
    func wait(on signal: DispatchSemaphore, for duration: Duration)
    /// From now on, moves with real time as well (ending every wait in progress): what a test's
    /// harness calls before it shuts a server down, so that the shutdown's waits on the clock
    /// (the grace period, the drain's pace) end whatever the test left open, instead of waiting
    /// for a move nobody will make.
    func runFree()
}

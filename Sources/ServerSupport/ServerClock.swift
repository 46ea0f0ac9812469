import Dispatch

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
/// Cost: `now` is one test of an optional reference before `ContinuousClock.now` (inlinable; no
/// existential call with the monotonic clock).
///
/// Thread-safety: a value of `Sendable` parts; `now` and `wait` may be called from any thread.
public struct ServerClock: Sendable, Equatable {
    /// The manual source; `nil` for the monotonic clock.
    @usableFromInline let source: (any ServerTimeSource)?

    /// `ContinuousClock` and Dispatch's timed waits: the server's clock outside tests.
    public static let monotonic = ServerClock(source: nil)

    /// A clock that reads `source` and waits on it (tests).
    public static func manual(_ source: any ServerTimeSource) -> ServerClock {
        ServerClock(source: source)
    }

    private init(source: (any ServerTimeSource)?) {
        self.source = source
    }

    /// Whether this is `monotonic`.
    @inlinable public var isMonotonic: Bool { source == nil }

    /// Now on this clock.
    @inlinable public var now: ContinuousClock.Instant {
        if let source { return source.now }
        return .now
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

    /// The real time a loop may block in poll(2) or epoll_wait(2) when its next decision is
    /// `duration` away on this clock: `duration` itself on the monotonic clock, at most
    /// `manualLookInterval` on a manual one (whose time moves without waking the loop).
    @inlinable public func realTimeout(for duration: Duration) -> Duration {
        source == nil ? duration : min(duration, Self.manualLookInterval)
    }

    /// How often, in real time, a loop on a manual clock looks at the time again: 10 ms.
    public static let manualLookInterval: Duration = .milliseconds(10)

    /// Equal when both are `monotonic`, or both read the same source object.
    public static func == (lhs: ServerClock, rhs: ServerClock) -> Bool {
        switch (lhs.source, rhs.source) {
        case (nil, nil): return true
        case (let left?, let right?): return left === right
        default: return false
        }
    }
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
}

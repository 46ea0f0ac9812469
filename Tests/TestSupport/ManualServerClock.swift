import Dispatch
import ForgePushToken

/// The project's one manual clock for the server: a time that moves only when the test calls
/// `advance(by:)` (swift-async-algorithms' manual clock and swift-nio's `EmbeddedEventLoop` are the
/// models), so that a deadline passes, a tick comes or a duration is measured because the test
/// says so, and the test waits for events (a wait begun, an answer given), never for time.
///
/// The server's targets read it through ServerSupport's `ServerClock.manual(_:)`: a test target
/// that uses it declares the one-line conformance `extension ManualServerClock: ServerTimeSource {}`
/// (this target builds with the library alone, on every platform, and cannot import ServerSupport).
/// The library's upload loop has its own (`ManualClock` in ForgePushTokenTests: a Swift `Clock`
/// that resumes sleeping tasks).
///
/// Its instants are `ContinuousClock.Instant`s: the real instant it was made at, plus every
/// advance since.
///
/// Thread-safety: all members may be called from any thread; one lock, over the time and the waits
/// in progress, released before any semaphore is signalled or waited on.
@available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
public final class ManualServerClock: Sendable {
    private struct Waiting {
        var number: Int
        var signal: DispatchSemaphore
        /// Set once the wait found no signal pending: its thread sleeps.
        var blocked = false
    }

    private struct State {
        var offset: Duration = .zero
        var waits: [Waiting] = []
        var begun = 0
        /// The real instant `runFree()` was called at: from then on the time also moves with
        /// real time.
        var freedAt: ContinuousClock.Instant?
    }

    private let start: ContinuousClock.Instant
    private let state = Locked(State())

    /// A clock that reads the real instant of its making until it is advanced.
    public init() {
        start = .now
    }

    /// The time the test set.
    public var now: ContinuousClock.Instant {
        let (offset, freedAt) = state.withLock { ($0.offset, $0.freedAt) }
        return start + offset + (freedAt.map { ContinuousClock.now - $0 } ?? .zero)
    }

    /// How far the test has moved the clock since it was made.
    public var elapsed: Duration { state.withLock { $0.offset } }

    /// Waits until `signal` is signalled, or until the test advances the clock (every advance ends
    /// every wait: an early end is allowed, and the caller checks the time again). `duration` is
    /// not measured: only an advance or the signal ends the wait (after `runFree()`, a real
    /// timed wait of `duration`).
    public func wait(on signal: DispatchSemaphore, for duration: Duration) {
        if state.withLock({ $0.freedAt != nil }) {
            _ = signal.wait(
                timeout: .now()
                    + .nanoseconds(
                        Int(duration.components.seconds) * 1_000_000_000
                            + Int(duration.components.attoseconds / 1_000_000_000)))
            return
        }
        let number = state.withLock { state -> Int in
            state.begun += 1
            state.waits.append(Waiting(number: state.begun, signal: signal))
            return state.begun
        }
        // A signal already pending (sent before this wait began) ends it before it counts as asleep.
        if signal.wait(timeout: .now()) == .timedOut {
            state.withLock { state in
                if let index = state.waits.firstIndex(where: { $0.number == number }) {
                    state.waits[index].blocked = true
                }
            }
            signal.wait()
        }
        state.withLock { $0.waits.removeAll { $0.number == number } }
    }

    /// From now on the time also moves with real time, and every wait in progress ends: a
    /// harness calls it before shutting its server down, whose waits on the clock (the grace
    /// period, the drain's pace) must end although the test no longer moves the time.
    public func runFree() {
        let waiting = state.withLock { state -> [DispatchSemaphore] in
            if state.freedAt == nil { state.freedAt = .now }
            return state.waits.map(\.signal)
        }
        for signal in waiting { signal.signal() }
    }

    /// Moves the time on by `duration`, and ends every wait in progress.
    public func advance(by duration: Duration) {
        let waiting = state.withLock { state -> [DispatchSemaphore] in
            state.offset += duration
            return state.waits.map(\.signal)
        }
        for signal in waiting { signal.signal() }
    }

    /// How many waits have begun so far.
    public var waitsBegun: Int { state.withLock { $0.begun } }

    /// Whether a wait begun after the first `mark` waits is asleep: its thread decided to wait
    /// after everything that happened before `mark` was read (a stop's or a track's signal, sent
    /// before, would have ended it before it slept).
    public func isWaiting(after mark: Int) -> Bool {
        state.withLock { $0.waits.contains { $0.number > mark && $0.blocked } }
    }
}

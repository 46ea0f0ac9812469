import Dispatch
import ForgePushToken

@testable import RedisTokenStore

/// A `RedisDeadlineClock` that moves only when the test calls `advance(by:)` (swift-async-algorithms'
/// manual clock and swift-nio's `EmbeddedEventLoop` are the models): a deadline passes because the
/// test says so, and the test waits for events (a wait begun, an answer given), never for time.
///
/// Thread-safety: all members may be called from any thread; one lock, over the time and the
/// waits in progress, released before any semaphore is signalled or waited on.
final class ManualDeadlineClock: RedisDeadlineClock {
    private struct Waiting {
        var number: Int
        var until: Double
        var signal: DispatchSemaphore
        /// Set once the wait found no signal pending: its thread sleeps.
        var blocked = false
    }

    private let state: Locked<(now: Double, waits: [Waiting], begun: Int)>

    /// A clock that reads `start` until it is advanced.
    init(at start: Double) {
        state = Locked((start, [], 0))
    }

    /// The time the test set.
    func now() -> Double { state.withLock { $0.now } }

    /// Waits until `signal` is signalled, or until the test advances the clock (every advance ends
    /// every wait: an early end is allowed, and the caller checks the time again).
    func wait(on signal: DispatchSemaphore, seconds: Double) {
        let number = state.withLock { state -> Int in
            state.begun += 1
            state.waits.append(Waiting(number: state.begun, until: state.now + seconds, signal: signal))
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

    /// Moves the time on by `seconds`, and ends every wait in progress.
    func advance(by seconds: Double) {
        let waiting = state.withLock { state -> [DispatchSemaphore] in
            state.now += seconds
            return state.waits.map(\.signal)
        }
        for signal in waiting { signal.signal() }
    }

    /// How many waits have begun so far.
    var waitsBegun: Int { state.withLock { $0.begun } }

    /// Whether a wait begun after the first `mark` waits is asleep: its thread decided to wait
    /// after everything that happened before `mark` was read (a stop's or a track's signal, sent
    /// before, would have ended it before it slept).
    func isWaiting(after mark: Int) -> Bool {
        state.withLock { $0.waits.contains { $0.number > mark && $0.blocked } }
    }
}

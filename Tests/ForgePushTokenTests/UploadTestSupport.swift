import ForgePushTokenTestSupport
import Foundation
import Testing

@testable import ForgePushToken

/// A clock whose time moves only when a test calls ``advance(by:)``, so that tests never sleep and
/// every wait is observable.
///
/// Records the duration of every sleep requested (deadline minus the time of the request).
@available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
final class ManualClock: Clock, Sendable {
    struct Instant: InstantProtocol {
        var offset: Duration

        func advanced(by duration: Duration) -> Instant { Instant(offset: offset + duration) }
        func duration(to other: Instant) -> Duration { other.offset - offset }
        static func < (lhs: Instant, rhs: Instant) -> Bool { lhs.offset < rhs.offset }
    }

    private struct Sleeper: Sendable {
        var id: UInt64
        var deadline: Instant
        var continuation: CheckedContinuation<Void, any Error>
    }

    private struct State: Sendable {
        var now = Instant(offset: .zero)
        var sleepers: [Sleeper] = []
        var nextID: UInt64 = 0
        var requested: [Duration] = []
    }

    private let state = Locked(State())

    var now: Instant { state.withLock { $0.now } }
    var minimumResolution: Duration { .zero }

    /// The durations of every sleep requested so far, in order.
    var requestedSleeps: [Duration] { state.withLock { $0.requested } }
    /// How many tasks are sleeping on this clock now.
    var sleeperCount: Int { state.withLock { $0.sleepers.count } }

    func sleep(until deadline: Instant, tolerance: Duration?) async throws {
        let id = state.withLock { state in
            defer { state.nextID += 1 }
            return state.nextID
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let immediate: Result<Void, any Error>? = state.withLock { state in
                    if Task.isCancelled { return .failure(CancellationError()) }
                    state.requested.append(state.now.duration(to: deadline))
                    if deadline <= state.now { return .success(()) }
                    state.sleepers.append(Sleeper(id: id, deadline: deadline, continuation: continuation))
                    return nil
                }
                if let immediate { continuation.resume(with: immediate) }
            }
        } onCancel: {
            let sleeper = state.withLock { state in
                state.sleepers.firstIndex { $0.id == id }.map { state.sleepers.remove(at: $0) }
            }
            sleeper?.continuation.resume(throwing: CancellationError())
        }
    }

    /// Moves time forward by `duration` and wakes every sleeper whose deadline has come.
    func advance(by duration: Duration) {
        let due = state.withLock { state in
            state.now = state.now.advanced(by: duration)
            let now = state.now
            let due = state.sleepers.filter { $0.deadline <= now }
            state.sleepers.removeAll { $0.deadline <= now }
            return due
        }
        for sleeper in due {
            sleeper.continuation.resume()
        }
    }
}

/// A random source that returns the given values in order, cycling.
struct ScriptedRandom: RandomNumberGenerator {
    var values: [UInt64]
    var index = 0

    mutating func next() -> UInt64 {
        defer { index += 1 }
        return values[index % values.count]
    }
}

@available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
typealias TokenUpload = PushTokenManager.TokenUpload
@available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
typealias UploadOutcome = PushTokenManager.UploadOutcome

/// An upload function whose calls a test answers one by one, recording every call and how many
/// ran at once.
@available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
final class ScriptedBackend: Sendable {
    /// One call of ``upload(_:)`` waiting for its answer.
    struct Call: Sendable {
        let id: UInt64
        let request: TokenUpload
        fileprivate let backend: ScriptedBackend

        /// The token the call uploads (`nil`: a clear).
        var value: String? { request.token }

        func succeed() { answer(.done) }
        func answer(_ outcome: UploadOutcome) { backend.answer(id, with: .success(outcome)) }
        func fail(_ error: any Error) { backend.answer(id, with: .failure(error)) }
    }

    private struct State: Sendable {
        /// Calls not yet handed to the test by `nextCall()`.
        var waiting: [Call] = []
        /// Every call not yet answered, by id.
        var open: [UInt64: CheckedContinuation<UploadOutcome, any Error>] = [:]
        var requests: [TokenUpload] = []
        var inFlight = 0
        var maximumInFlight = 0
        var cancelled = 0
        var nextID: UInt64 = 0
    }

    private let state = Locked(State())
    /// When `true`, every call succeeds at once (after a `Task.yield()`) instead of waiting.
    let automatic: Bool

    init(automatic: Bool = false) {
        self.automatic = automatic
    }

    /// Every value uploaded (attempted), in order.
    var values: [String?] { state.withLock { $0.requests.map(\.token) } }
    /// Every request, in order.
    var requests: [TokenUpload] { state.withLock { $0.requests } }
    /// The most calls that ever ran at once.
    var maximumInFlight: Int { state.withLock { $0.maximumInFlight } }
    /// How many calls are waiting for an answer now.
    var waitingCount: Int { state.withLock { $0.waiting.count } }
    /// How many calls ended because their task was cancelled.
    var cancelledCount: Int { state.withLock { $0.cancelled } }

    @Sendable func upload(_ request: TokenUpload) async throws -> UploadOutcome {
        let id = state.withLock { state in
            state.requests.append(request)
            state.inFlight += 1
            state.maximumInFlight = max(state.maximumInFlight, state.inFlight)
            defer { state.nextID += 1 }
            return state.nextID
        }
        defer { state.withLock { $0.inFlight -= 1 } }
        if automatic {
            await Task.yield()
            return .done
        }
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<UploadOutcome, any Error>) in
                let cancelled = state.withLock { state in
                    if Task.isCancelled { return true }
                    state.waiting.append(Call(id: id, request: request, backend: self))
                    state.open[id] = continuation
                    return false
                }
                if cancelled { continuation.resume(throwing: CancellationError()) }
            }
        } onCancel: {
            let open = state.withLock { state in
                let continuation = state.open.removeValue(forKey: id)
                if continuation != nil { state.cancelled += 1 }
                return continuation
            }
            open?.resume(throwing: CancellationError())
        }
    }

    /// Ends call `id` with `result`, unless it has ended already (cancelled).
    fileprivate func answer(_ id: UInt64, with result: Result<UploadOutcome, any Error>) {
        state.withLock { $0.open.removeValue(forKey: id) }?.resume(with: result)
    }

    /// The oldest call waiting for an answer, waiting for one if there is none.
    func nextCall(sourceLocation: SourceLocation = #_sourceLocation) async -> Call? {
        await waitUntil("an upload call waiting for its answer", sourceLocation: sourceLocation) { waitingCount > 0 }
        return state.withLock { state in
            state.waiting.isEmpty ? nil : state.waiting.removeFirst()
        }
    }
}

/// A wall clock a test sets: what the upload loop records as the time of an acknowledgement and
/// compares a persisted acknowledgement with (`Date`, which survives a relaunch).
final class WallClock: Sendable {
    private let time: Locked<Date>

    /// A clock at `start` (2026-01-01T00:00:00Z by default).
    init(_ start: Date = Date(timeIntervalSince1970: 1_767_225_600)) {
        time = Locked(start)
    }

    /// The current time, as the upload loop reads it.
    @Sendable func now() -> Date { time.withLock { $0 } }

    /// Moves the time forward by `seconds`.
    func advance(by seconds: TimeInterval) {
        time.withLock { $0 = $0.addingTimeInterval(seconds) }
    }
}

/// The fire-and-forget `signOut()`: in an `async` context, `manager.signOut()` is the awaited one.
@available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
func signOutNow(_ manager: PushTokenManager) {
    manager.signOut()
}

/// An authorization status a test sets: what the upload loop reads at its start and on returning
/// to the foreground, and how many times it read it.
final class FakeAuthorization: NotificationAuthorizationReader {
    private let state: Locked<(status: NotificationAuthorization?, reads: Int)>

    init(_ status: NotificationAuthorization?) {
        state = Locked((status, 0))
    }

    /// How many times the loop read the status.
    var reads: Int { state.withLock { $0.reads } }

    /// Changes the status the next read returns (as the user would in Settings).
    func set(_ status: NotificationAuthorization?) {
        state.withLock { $0.status = status }
    }

    func read() async -> NotificationAuthorization? {
        state.withLock { state in
            state.reads += 1
            return state.status
        }
    }
}

import ForgePushTokenTestSupport
import Foundation
import Testing

@testable import ForgePushToken

/// A log handler that discards everything (the shared test support's `quiet`).
let silent: PushTokenManager.LogHandler = quiet

/// An error with a fixed description.
struct TestError: Error, CustomStringConvertible {
    var description: String
}

/// `n` as a 4-byte big-endian device token. Its hex form, ``hex(_:)``, sorts like `n`.
func token(_ n: UInt32) -> Data {
    Data([UInt8(n >> 24), UInt8(n >> 16 & 0xff), UInt8(n >> 8 & 0xff), UInt8(n & 0xff)])
}

/// The expected hex text of ``token(_:)``, computed independently of `DeviceTokenHex`.
func hex(_ n: UInt32) -> String {
    let digits = String(n, radix: 16)
    return String(repeating: "0", count: 8 - digits.count) + digits
}

/// The number encoded by a token from ``token(_:)``, or 0 for `nil`.
func number(_ hexToken: String?) -> UInt32 {
    hexToken.map { UInt32($0, radix: 16)! } ?? 0
}

/// The next element of `stream`: `.some(value)`, or `nil` if the stream has ended.
func next(_ stream: AsyncStream<String?>) async -> String?? {
    var iterator = stream.makeAsyncIterator()
    return await iterator.next()
}

/// The value of `task`, cancelling it if the waiting task is cancelled (as a test's time limit
/// does), so that a test waiting on a loop that never ends fails instead of hanging.
func value<Success: Sendable>(of task: Task<Success, Never>) async -> Success {
    await withTaskCancellationHandler {
        await task.value
    } onCancel: {
        task.cancel()
    }
}

/// Suspends (yielding, never sleeping) until `condition` holds, or records an issue if the task
/// is cancelled first (as a test's time limit does).
func waitUntil(
    _ condition: () -> Bool,
    sourceLocation: SourceLocation = #_sourceLocation
) async {
    while !condition() {
        if Task.isCancelled {
            Issue.record("cancelled while waiting for a condition", sourceLocation: sourceLocation)
            return
        }
        await Task.yield()
    }
}

/// Proves that `action` makes `stream` emit nothing.
///
/// A consumer is parked on `stream`, `action` runs, the consumer is given a grace period in which
/// a wrong emission would reach it, then `followUp` runs and the consumer must receive `expected`.
/// A correct implementation always passes; a wrong one is caught unless the consumer task had
/// not even started within the grace periods.
func expectNoEmission(
    on stream: AsyncStream<String?>,
    from action: () -> Void,
    thenReceives expected: String?,
    from followUp: () -> Void,
    sourceLocation: SourceLocation = #_sourceLocation
) async throws {
    let pending = Task { await next(stream) }
    try await Task.sleep(for: .milliseconds(20))
    action()
    try await Task.sleep(for: .milliseconds(50))
    followUp()
    #expect(await value(of: pending) == .some(expected), sourceLocation: sourceLocation)
}

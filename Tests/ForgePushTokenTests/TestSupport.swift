import ForgePushTokenTestSupport
import Foundation
import Testing

@testable import ForgePushToken

/// A log handler that discards everything (the shared test support's `quiet`).
let silent: PushTokenManager.LogHandler = quiet

/// A suite's guard against a hang: Swift Testing's time limit (`timeLimit(_:)`) of 10 minutes per
/// test where the system has `Clock` (macOS 13, iOS 16, tvOS 16, watchOS 9, Linux), which it needs;
/// no guard before that, so that the suites still build for the package's macOS 12.
///
/// Only a hang guard, never a deadline a test can meet or miss (docs/testing.md, "Waiting in
/// tests"): under Thread Sanitizer with both cores busy, the 1,000 subscribe-and-cancel cycles took
/// 67 s and the subscription race 115 s, and a limit of 1 and 2 minutes failed one run of two
/// (issue 31). Ten minutes is far above either.
func hangGuard() -> any SuiteTrait {
    if #available(iOS 16, macOS 13, tvOS 16, watchOS 9, *) {
        return TimeLimitTrait.timeLimit(.minutes(10))
    }
    return ConditionTrait.enabled(if: true)
}

/// A weak reference to `value` (`weak let` needs Swift 6.2; `weak var` that is never mutated
/// warns there), so the tests build with the Swift 6.0 of Xcode 16 and without warnings on 6.2+.
final class WeakReference<Value: AnyObject> {
    weak var value: Value?

    init(_ value: Value?) {
        self.value = value
    }
}

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

/// Proves that `action` makes a subscription emit nothing, by the event that must come next.
///
/// A manager is made and prepared by `setUp`; a subscription takes its first value; `action` runs;
/// then the manager is released, which finishes the stream. The next event must be the end of the
/// stream: an element emitted by `action` would have been buffered and would come before the end
/// (as `CleanupTests.deinitDeliversTheBufferedValueThenEnds` shows). No waiting on time.
///
/// - Returns: The manager's token after `action`.
@discardableResult
func expectNoEmission(
    logHandler: @escaping PushTokenManager.LogHandler = silent,
    setUp: (PushTokenManager) -> Void = { _ in },
    from action: (PushTokenManager) -> Void,
    sourceLocation: SourceLocation = #_sourceLocation
) async -> String? {
    var manager: PushTokenManager? = PushTokenManager(logHandler: logHandler)
    let released = WeakReference(manager)
    setUp(manager!)
    var iterator = manager!.tokenStream.makeAsyncIterator()
    _ = await iterator.next()  // the current value
    action(manager!)
    let token = manager!.token
    manager = nil
    guard released.value == nil else {
        Issue.record("the manager outlived its last reference", sourceLocation: sourceLocation)
        return token
    }
    let next = await iterator.next()
    #expect(next == nil, "emitted \(String(describing: next)) where nothing was due", sourceLocation: sourceLocation)
    return token
}

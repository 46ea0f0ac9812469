import ForgePushTokenTestSupport
import Foundation
import Observation
import Testing

@testable import ForgePushToken

/// Compile-time check that `PushTokenManager` is `Observable` and `Sendable`: it type-checks only
/// while both conformances hold (never called; see also PublicSurfaceTests.swift).
@available(iOS 17, macOS 14, tvOS 17, watchOS 10, *)
private func compileTimeCheckTheManagerIsObservable() {
    func observable<T: Observable & Sendable>(_: T.Type) {}
    observable(PushTokenManager.self)
}

/// `PushTokenManager` is `Observable`: what a SwiftUI view that reads `token` relies on, checked
/// with `withObservationTracking` (the function SwiftUI's tracking is built on).
///
/// Observation needs iOS 17 / macOS 14 / tvOS 17 / watchOS 10: each test says so (Swift Testing
/// skips it on older systems; a suite type cannot carry the attribute).
@Suite("Observation")
struct ObservationTests {
    /// Tracks one read of `manager.token` and counts its `onChange` calls, recording the value of
    /// `token` the handler sees.
    @available(iOS 17, macOS 14, tvOS 17, watchOS 10, *)
    final class Tracker: Sendable {
        private let seen = Locked<[String?]>([])

        init(_ manager: PushTokenManager) {
            withObservationTracking {
                _ = manager.token
            } onChange: { [seen, weak manager] in
                // Weak: a tracker that never fires stays in the manager's registrar, and a strong
                // capture would make a cycle (manager → registrar → handler → manager).
                let current = manager?.token
                seen.withLock { $0.append(current) }
            }
        }

        var calls: [String?] { seen.withLock { $0 } }
    }

    @available(iOS 17, macOS 14, tvOS 17, watchOS 10, *)
    @Test func aChangeFiresOnChangeOnce() {
        let manager = PushTokenManager(logHandler: silent)
        let tracker = Tracker(manager)
        manager.didRegister(deviceToken: token(1))
        // willSet: the handler runs before the change, and sees the value it replaces.
        #expect(tracker.calls == [nil])
        #expect(manager.token == hex(1))
        manager.didRegister(deviceToken: token(2))
        #expect(tracker.calls == [nil])  // tracking is one-shot, as Observation defines it
    }

    @available(iOS 17, macOS 14, tvOS 17, watchOS 10, *)
    @Test func reRegisteringTheSameTokenDoesNotFire() {
        let manager = PushTokenManager(logHandler: silent)
        manager.didRegister(deviceToken: token(1))
        let tracker = Tracker(manager)
        manager.didRegister(deviceToken: token(1))
        manager.didRegister(deviceToken: Data())  // rejected: no change either
        #expect(tracker.calls.isEmpty)
        manager.didRegister(deviceToken: token(2))
        #expect(tracker.calls == [hex(1)])  // before the change
    }

    @available(iOS 17, macOS 14, tvOS 17, watchOS 10, *)
    @Test func aFailureFiresOnlyWhenItClearsAToken() {
        let manager = PushTokenManager(logHandler: silent)
        let tracker = Tracker(manager)
        manager.didFailToRegister(error: TestError(description: "no token yet"))
        #expect(tracker.calls.isEmpty)
        manager.didRegister(deviceToken: token(3))
        let second = Tracker(manager)
        manager.didFailToRegister(error: TestError(description: "revoked"))
        #expect(tracker.calls == [nil])  // fired by the registration, before it
        #expect(second.calls == [hex(3)])  // fired by the failure, before it clears the token
        #expect(manager.token == nil)
    }

    @available(iOS 17, macOS 14, tvOS 17, watchOS 10, *)
    @Test func untrackedPropertiesAndOtherManagersDoNotFire() {
        let manager = PushTokenManager(logHandler: silent)
        let other = PushTokenManager(logHandler: silent)
        let tracker = Tracker(manager)
        other.didRegister(deviceToken: token(1))
        _ = manager.tokenStream
        #expect(tracker.calls.isEmpty)
    }

    @available(iOS 17, macOS 14, tvOS 17, watchOS 10, *)
    @Test func theHandlerMayReadAndCallBackIntoTheManager() async {
        // onChange runs inside willSet, before the change and with no lock of the manager held:
        // reading `token`, subscribing and asking for a re-send from it must neither trap (the
        // lock is not reentrant) nor deadlock, and it sees the value being replaced. (Changing
        // `token` from inside willSet would re-enter Observation's willSet before the tracking is
        // cancelled, as for any @Observable property, so the docs say to change it asynchronously.)
        let manager = PushTokenManager(logHandler: silent)
        let seen = Locked<[String?]>([])
        withObservationTracking {
            _ = manager.token
        } onChange: { [weak manager] in
            guard let manager else { return }
            let stream = manager.tokenStream
            manager.resendToken()
            seen.withLock { $0.append(manager.token) }
            _ = stream
        }
        manager.didRegister(deviceToken: token(1))
        #expect(seen.withLock { $0 } == [nil])
        #expect(manager.token == hex(1))
        #expect(await next(manager.tokenStream) == .some(hex(1)))
        #expect(manager.subscriberCount == 0)  // the handler's subscription ended with its stream
    }

    @available(iOS 17, macOS 14, tvOS 17, watchOS 10, *)
    @Test func concurrentChangesFromManyThreadsEachReachATracker() async {
        // Under Thread Sanitizer too: trackers installed and fired from several threads at once.
        let manager = PushTokenManager(logHandler: silent)
        let fired = Locked([Int](repeating: 0, count: 8 * 200))
        await runOnThreads(8) { thread in
            for n in 0..<200 {
                let tracker = thread * 200 + n
                withObservationTracking {
                    _ = manager.token
                } onChange: {
                    fired.withLock { $0[tracker] += 1 }
                }
                manager.didRegister(deviceToken: token(UInt32(thread * 1_000 + n + 1)))
            }
        }
        // Every tracker was installed before a change that was its thread's own, so each fired.
        // Changes made at the same moment on two threads may both reach a tracker before it
        // removes itself (Observation promises at least one call, as for any Observable class).
        #expect(fired.withLock { $0 }.allSatisfy { $0 >= 1 })
    }
}

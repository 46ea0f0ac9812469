import Testing

@testable import ForgePushToken

/// `registerForRemoteNotifications(using:)` calls the registrar, on the main actor.
@MainActor
final class FakeRegistrar: RemoteNotificationRegistrar {
    private(set) var calls = 0

    func registerForRemoteNotifications() {
        // Traps unless running on the main actor's executor. (On Linux that executor is the main
        // dispatch queue, which the test runner services from a worker thread after the process's
        // main thread has parked, so `Thread.isMainThread` is not a useful check here.)
        MainActor.assertIsolated()
        calls += 1
    }
}

@Suite("Platform registration")
struct RegistrationTests {
    @Test @MainActor func callsTheRegistrarOnTheMainActor() {
        let manager = PushTokenManager(logHandler: silent)
        let registrar = FakeRegistrar()
        manager.registerForRemoteNotifications(using: registrar)
        manager.registerForRemoteNotifications(using: registrar)
        #expect(registrar.calls == 2)
    }

    @Test func hopsToTheMainActorFromElsewhere() async {
        let manager = PushTokenManager(logHandler: silent)
        let registrar = FakeRegistrar()
        await manager.registerForRemoteNotifications(using: registrar)
        #expect(await registrar.calls == 1)
    }

    @Test @MainActor func aStructRegistrarWorks() {
        struct Counting: RemoteNotificationRegistrar {
            let count: Locked<Int>
            func registerForRemoteNotifications() {
                count.withLock { $0 += 1 }
            }
        }
        let count = Locked(0)
        PushTokenManager(logHandler: silent).registerForRemoteNotifications(using: Counting(count: count))
        #expect(count.withLock { $0 } == 1)
    }
}

import ForgePushToken  // not @testable: only the public API is visible here
import Foundation
import Observation
import Testing

/// The public surface fixed by the contract compiles with these names and shapes.
@Suite("Public surface")
struct PublicSurfaceTests {
    @Test func namesAndShapes() {
        func requiresSendable<T: Sendable>(_: T.Type) -> Bool { true }
        #expect(requiresSendable(PushTokenManager.self))
        #expect(requiresSendable(PushTokenManager.LogLevel.self))

        let manager = PushTokenManager(logHandler: { (_: PushTokenManager.LogLevel, _: String) in })
        let token: String? = manager.token
        let stream: AsyncStream<String?> = manager.tokenStream
        let register: (Data) -> Void = manager.didRegister(deviceToken:)
        let fail: (any Error) -> Void = manager.didFailToRegister(error:)
        let makeDefault: () -> PushTokenManager = PushTokenManager.init
        #expect(token == nil)
        withExtendedLifetime((stream, register, fail, makeDefault)) {}
    }

    /// The surface added by issue 12 (uploads, Observation), as an app sees it.
    @Test func uploadAndObservationShapes() throws {
        func requires<T: Observable & Sendable>(_: T.Type) -> Bool { true }
        #expect(requires(PushTokenManager.self))
        func requiresSendableHashable<T: Sendable & Hashable>(_: T.Type) -> Bool { true }
        #expect(requiresSendableHashable(PushTokenManager.UploadRetryPolicy.self))

        let manager = PushTokenManager(logHandler: { _, _ in })
        let upload: (PushTokenManager, @escaping @Sendable (String?) async throws -> Void) async -> Void = {
            await $0.uploadTokenChanges(upload: $1)
        }
        let configured: (PushTokenManager, PushTokenManager.UploadRetryPolicy) async -> Void = { manager, policy in
            await manager.uploadTokenChanges(
                retryPolicy: policy, clock: SuspendingClock(), randomSource: SystemRandomNumberGenerator(),
                upload: { _ in })
        }
        let policy: PushTokenManager.UploadRetryPolicy = try .init(
            initialDelay: .seconds(1), maximumDelay: .seconds(300), jitter: 0.5)
        #expect(policy == .standard)
        withExtendedLifetime((manager, upload, configured)) {}
    }
}

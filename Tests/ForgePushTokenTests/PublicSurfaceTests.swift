import ForgePushToken  // not @testable: only the public API is visible here
import Foundation
import Observation
import Testing

// Compile-time checks: each call below type-checks only while the public type meets the
// constraint, so the test target does not build if one breaks. They run nothing and are not
// tests; they are never called.

/// Compiles only while `T` is `Sendable`.
private func compileTimeCheckSendable<T: Sendable>(_: T.Type) {}
/// Compiles only while `T` is `Sendable` and `Hashable`.
private func compileTimeCheckSendableHashable<T: Sendable & Hashable>(_: T.Type) {}
/// Compiles only while `T` is `Observable` and `Sendable`.
@available(iOS 17, macOS 14, tvOS 17, watchOS 10, *)
private func compileTimeCheckObservable<T: Observable & Sendable>(_: T.Type) {}

/// The public types keep their conformances (compile-time checks).
@available(iOS 17, macOS 14, tvOS 17, watchOS 10, *)
private func compileTimeChecksOfThePublicTypes() {
    compileTimeCheckSendable(PushTokenManager.self)
    compileTimeCheckSendable(PushTokenManager.LogLevel.self)
    compileTimeCheckObservable(PushTokenManager.self)
    compileTimeCheckSendableHashable(PushTokenManager.UploadRetryPolicy.self)
    compileTimeCheckSendableHashable(PushTokenManager.TokenUpload.self)
    compileTimeCheckSendableHashable(PushTokenManager.UploadOutcome.self)
    compileTimeCheckSendableHashable(APNsEnvironment.self)
    compileTimeCheckSendableHashable(ProvisioningProfileError.self)
    compileTimeCheckSendableHashable(ServerRecord.self)
    compileTimeCheckSendable(MemoryServerRecordStore.self)
}

/// The public surface fixed by the contract, with these names and shapes.
@Suite("Public surface")
struct PublicSurfaceTests {
    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func namesAndShapes() {
        let manager = PushTokenManager(logHandler: { (_: PushTokenManager.LogLevel, _: String) in })
        let token: String? = manager.token
        let stream: AsyncStream<String?> = manager.tokenStream
        let register: (Data) -> Void = manager.didRegister(deviceToken:)
        let fail: (any Error) -> Void = manager.didFailToRegister(error:)
        let makeDefault: () -> PushTokenManager = PushTokenManager.init
        #expect(token == nil)
        withExtendedLifetime((stream, register, fail, makeDefault)) {}
    }

    /// The upload surface (issues 12 and 18), as an app sees it.
    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func uploadShapes() throws {
        let manager = PushTokenManager(logHandler: { _, _ in })
        // The upload need not be @Sendable.
        let upload:
            (PushTokenManager, (PushTokenManager.TokenUpload) async throws -> PushTokenManager.UploadOutcome) async ->
                Void = {
                    await $0.uploadTokenChanges(upload: $1)
                }
        let configured: (PushTokenManager, PushTokenManager.UploadRetryPolicy) async -> Void = { manager, policy in
            await manager.uploadTokenChanges(
                retryPolicy: policy, environment: .development, clock: SuspendingClock(),
                randomSource: SystemRandomNumberGenerator(), isolation: nil, upload: { _ in .retry() })
        }
        let resend: () -> Void = manager.resendToken
        let signOut: () -> Void = manager.signOut
        let resume: () -> Void = manager.resumeUploads
        let recorded: (PushTokenManager, any ServerRecordStore) async -> Void = { manager, store in
            await manager.uploadTokenChanges(serverRecord: store, upload: { _ in .done })
        }
        let store: any ServerRecordStore = PushTokenManager.defaultServerRecordStore()
        #expect(store.load() == nil)
        let policy: PushTokenManager.UploadRetryPolicy = try .init(
            initialDelay: .seconds(1), maximumDelay: .seconds(300), jitter: 0.5, resendInterval: .seconds(86_400))
        #expect(policy == .standard)
        let awaited: (PushTokenManager) async -> PushTokenManager.SignOutOutcome = { await $0.signOut() }
        let foreground: () -> Void = manager.applicationWillEnterForeground
        let daily = try PushTokenManager.UploadRetryPolicy(
            initialDelay: .seconds(1), maximumDelay: .seconds(300), jitter: 0.5, resendInterval: .seconds(86_400))
        #expect(daily.resendInterval == .seconds(86_400))
        let decide: (Data?, Bool) throws(ProvisioningProfileError) -> APNsEnvironment =
            APNsEnvironment.decide(provisioningProfile:isSimulator:)
        #expect(try decide(nil, false) == .production)
        withExtendedLifetime((manager, upload, configured, resend, signOut, resume, recorded, awaited, foreground)) {}
    }
}

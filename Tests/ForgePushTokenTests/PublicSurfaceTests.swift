import Foundation
import Testing

import ForgePushToken  // not @testable: only the public API is visible here

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
}

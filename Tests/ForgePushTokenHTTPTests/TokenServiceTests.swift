import Foundation
import Testing

import ForgePushToken
@testable import ForgePushTokenHTTP

/// `TokenSnapshot` rendering and `TokenService` versioning.
@Suite("TokenSnapshot and TokenService")
struct TokenServiceTests {
    // MARK: TokenSnapshot

    @Test("version 0 without a token: {\"token\":null} and its event")
    func nullSnapshot() {
        let snapshot = TokenSnapshot(version: 0, token: nil)
        #expect(snapshot.version == 0)
        #expect(snapshot.token == nil)
        #expect(snapshot.tokenBody == utf8(#"{"token":null}"#))
        #expect(snapshot.event == utf8("id: 0\nevent: token\ndata: {\"token\":null}\n\n"))
    }

    @Test("a token snapshot renders the hex in the body and the event")
    func tokenSnapshot() {
        let snapshot = TokenSnapshot(version: 3, token: "ab")
        #expect(snapshot.tokenBody == utf8(#"{"token":"ab"}"#))
        #expect(snapshot.event == utf8("id: 3\nevent: token\ndata: {\"token\":\"ab\"}\n\n"))

        let long = lowerHex(tokenBytes(256))
        let big = TokenSnapshot(version: UInt64.max, token: long)
        #expect(string(big.tokenBody) == #"{"token":""# + long + #""}"#)
        #expect(string(big.event) == expectedEvent(UInt64.max, long))
    }

    @Test("snapshots are equal by version and token")
    func snapshotEquality() {
        #expect(TokenSnapshot(version: 1, token: "ab") == TokenSnapshot(version: 1, token: "ab"))
        #expect(TokenSnapshot(version: 1, token: "ab") != TokenSnapshot(version: 2, token: "ab"))
        #expect(TokenSnapshot(version: 1, token: "ab") != TokenSnapshot(version: 1, token: "cd"))
        #expect(TokenSnapshot(version: 1, token: nil) != TokenSnapshot(version: 1, token: "ab"))
    }

    // MARK: TokenService

    @Test("a fresh service is version 0 with the manager's token")
    func initialState() {
        let service = makeService()
        #expect(service.snapshot == TokenSnapshot(version: 0, token: nil))
        #expect(service.snapshot.tokenBody == utf8(#"{"token":null}"#))

        let manager = PushTokenManager(logHandler: quiet)
        manager.didRegister(deviceToken: Data([0xde, 0xad]))
        let restored = TokenService(manager: manager, version: 7)
        #expect(restored.snapshot == TokenSnapshot(version: 7, token: "dead"))
        #expect(restored.manager === manager)
    }

    @Test("the version grows by one per change only")
    func versionPerChange() {
        let service = makeService()
        let first = service.register(deviceToken: [0x0a])
        #expect(first.changed)
        #expect(first.snapshot == TokenSnapshot(version: 1, token: "0a"))

        let same = service.register(deviceToken: [0x0a])
        #expect(!same.changed)
        #expect(same.snapshot == TokenSnapshot(version: 1, token: "0a"))
        #expect(service.snapshot.version == 1)
    }

    @Test("A → B → A gives versions 1, 2, 3")
    func aba() {
        let service = makeService()
        let a: [UInt8] = [0xaa, 0x01], b: [UInt8] = [0xbb, 0x02]
        #expect(service.register(deviceToken: a) == TokenService.Change(snapshot: TokenSnapshot(version: 1, token: "aa01"), changed: true))
        #expect(service.register(deviceToken: b) == TokenService.Change(snapshot: TokenSnapshot(version: 2, token: "bb02"), changed: true))
        #expect(service.register(deviceToken: a) == TokenService.Change(snapshot: TokenSnapshot(version: 3, token: "aa01"), changed: true))
        #expect(service.snapshot.tokenBody == utf8(#"{"token":"aa01"}"#))
        #expect(service.snapshot.event == utf8(expectedEvent(3, "aa01")))
    }

    @Test("fail with no token does not bump; fail with a token clears and bumps")
    func failVersions() {
        let recorder = LogRecorder()
        let service = makeService(log: recorder.handler)
        let nothing = service.fail(error: RegistrationFailure(message: "x"))
        #expect(!nothing.changed)
        #expect(nothing.snapshot == TokenSnapshot(version: 0, token: nil))

        _ = service.register(deviceToken: [1])
        let cleared = service.fail(error: RegistrationFailure(message: "y", domain: "D", code: 2))
        #expect(cleared.changed)
        #expect(cleared.snapshot == TokenSnapshot(version: 2, token: nil))
        #expect(service.manager.token == nil)

        let again = service.fail(error: RegistrationFailure(message: "z"))
        #expect(!again.changed)
        #expect(service.snapshot.version == 2)
        #expect(recorder.recorded.map(\.message) == [
            "registration failed: x", "registration failed: D 2: y", "registration failed: z",
        ])
    }

    @Test("an empty token is rejected by the manager: no change")
    func emptyTokenNoChange() {
        let service = makeService()
        _ = service.register(deviceToken: [9])
        let change = service.register(deviceToken: [])
        #expect(!change.changed)
        #expect(service.snapshot == TokenSnapshot(version: 1, token: "09"))
    }

    @Test("concurrent writes: one version per change, snapshot matches the manager")
    func concurrentWrites() async {
        let service = makeService()
        let changes = Locked<[UInt64]>([])
        await runOnThreads(8) { thread in
            for i in 0..<200 {
                let change = service.register(deviceToken: [UInt8(thread), UInt8(i)])
                if change.changed { changes.withLock { $0.append(change.snapshot.version) } }
                _ = service.snapshot
            }
        }
        let versions = changes.withLock { $0 }.sorted()
        #expect(versions == Array(1...1600))
        #expect(service.snapshot.version == 1600)
        #expect(service.snapshot.token == service.manager.token)
    }
}

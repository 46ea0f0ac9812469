import ForgePushToken
import ForgePushTokenOwner
import ForgePushTokenOwnerTestSupport
import ForgePushTokenTestSupport
import Foundation
import HTTPServing
import ServerSupport
import Testing

@testable import TokenService

/// `TokenSnapshot` rendering and versioning through the `TokenOwner`.
@Suite("TokenSnapshot and TokenOwner")
struct SnapshotAndOwnerTests {
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

    @Test("copies share one rendering, made once even when readers race for it")
    func renderingIsSharedAndMadeOnce() async {
        let snapshot = TokenSnapshot(version: 7, token: "0a")
        // Eight first reads at once; every array they return is kept alive, so equal storage
        // addresses can only mean one rendering, never a freed one made again at the same place.
        let bodies = await withTaskGroup(of: [UInt8].self) { group in
            for _ in 0..<8 { group.addTask { [snapshot] in snapshot.tokenBody } }
            return await group.reduce(into: []) { $0.append($1) }
        }
        let copy = snapshot
        let events = [snapshot.event, copy.event]
        func address(_ bytes: [UInt8]) -> Int { bytes.withUnsafeBufferPointer { Int(bitPattern: $0.baseAddress) } }
        #expect(bodies.count == 8)
        #expect(bodies.allSatisfy { $0 == utf8(#"{"token":"0a"}"#) })
        #expect(Set(bodies.map(address)).count == 1)
        #expect(address(copy.tokenBody) == address(bodies[0]))
        #expect(address(events[0]) == address(events[1]))
        // A prepared copy (what the owner offers subscribers) holds the same rendering.
        let ready = snapshot.prepared()
        #expect(ready == snapshot && address(ready.event) == address(events[0]))
        #expect(address(TokenSnapshot(version: 8, token: nil).prepared().tokenBody) != 0)
        #expect(copy.entityTag == EntityTag.strong(digesting: utf8(#"{"token":"0a"}"#)))
    }

    @Test("snapshots are equal by version and token")
    func snapshotEquality() {
        #expect(TokenSnapshot(version: 1, token: "ab") == TokenSnapshot(version: 1, token: "ab"))
        #expect(TokenSnapshot(version: 1, token: "ab") != TokenSnapshot(version: 2, token: "ab"))
        #expect(TokenSnapshot(version: 1, token: "ab") != TokenSnapshot(version: 1, token: "cd"))
        #expect(TokenSnapshot(version: 1, token: nil) != TokenSnapshot(version: 1, token: "ab"))
    }

    // MARK: TokenOwner over the memory store

    /// The outcome of a commit decided at once, `nil` for a pending one.
    private static func decided(_ result: CommitResult) -> CommitOutcome? {
        guard case .decided(let outcome) = result else { return nil }
        return outcome
    }

    @Test("commit(_:): a local store's decision is returned decided, applied and current")
    func commitOnALocalStore() {
        let owner = makeOwner()
        #expect(Self.decided(owner.commit("ab")) == .applied(TokenState(version: 1, token: "ab")))
        #expect(Self.decided(owner.commit("ab")) == .unchanged(TokenState(version: 1, token: "ab")))
        #expect(owner.current == TokenSnapshot(version: 1, token: "ab"))
        let scripted = TokenOwner<TokenSnapshot>(
            store: ScriptedStore(answering: .atOnce), initial: .initial, maxSubscribers: 1)
        #expect(Self.decided(scripted.commit("cd")) == .applied(TokenState(version: 1, token: "cd")))
        owner.stop()
        #expect(Self.decided(owner.commit("ef")) == .stopping)
        #expect(owner.current == TokenSnapshot(version: 1, token: "ab"))
    }

    @Test("commit(_:): a store that decides later gets the same call; its outcome comes through the pending commit")
    func commitOnAStoreThatDecidesLater() {
        let store = ScriptedStore(answering: .whenReleased)
        let owner = TokenOwner<TokenSnapshot>(store: store, initial: .initial, maxSubscribers: 1)
        let outcome = Locked<CommitOutcome?>(nil)
        guard case .pending(let pending) = owner.commit("ab") else {
            Issue.record("the outcome of a store that decides later was returned at once")
            return
        }
        #expect(pending.outcome(orWhenDecided: { answered in outcome.withLock { $0 = answered } }) == nil)
        #expect(store.proposed == ["ab"])
        #expect(owner.current == TokenSnapshot(version: 0, token: nil), "nothing is applied before the store decides")
        #expect(outcome.withLock { $0 } == nil)
        #expect(store.release())
        #expect(outcome.withLock { $0 } == .applied(TokenState(version: 1, token: "ab")))
        #expect(owner.current == TokenSnapshot(version: 1, token: "ab"))
        owner.stop()
        #expect(Self.decided(owner.commit("cd")) == .stopping, "stopping is answered at once")
        #expect(store.proposed == ["ab"], "a stopping owner asked the store")
    }

    @Test("an owner starts at the state it is given")
    func initialState() {
        let owner = makeOwner()
        #expect(owner.current == TokenSnapshot(version: 0, token: nil))
        #expect(owner.current.tokenBody == utf8(#"{"token":null}"#))

        let restored = TokenOwner<TokenSnapshot>(
            store: MemoryTokenStore(), initial: TokenState(version: 7, token: "dead"),
            maxSubscribers: 1)
        #expect(restored.current == TokenSnapshot(version: 7, token: "dead"))
        #expect(restored.version == 7)
    }

    @Test("the version grows by one per change only")
    func versionPerChange() {
        let owner = makeOwner()
        #expect(commitAtOnce(owner, "0a") == .applied(TokenState(version: 1, token: "0a")))
        #expect(commitAtOnce(owner, "0a") == .unchanged(TokenState(version: 1, token: "0a")))
        #expect(owner.version == 1)
    }

    @Test("A → B → A gives versions 1, 2, 3")
    func aba() {
        let owner = makeOwner()
        #expect(commitAtOnce(owner, "aa01") == .applied(TokenState(version: 1, token: "aa01")))
        #expect(commitAtOnce(owner, "bb02") == .applied(TokenState(version: 2, token: "bb02")))
        #expect(commitAtOnce(owner, "aa01") == .applied(TokenState(version: 3, token: "aa01")))
        #expect(owner.current.tokenBody == utf8(#"{"token":"aa01"}"#))
        #expect(owner.current.event == utf8(expectedEvent(3, "aa01")))
    }

    @Test("POST /fail with no token does not bump; with a token it clears and bumps; each is logged")
    func failVersions() throws {
        let recorder = LogRecorder()
        let responder = makeResponder(log: recorder.handler)
        try expectChange(try responder.send("POST", "/fail", body: utf8("x")), token: nil, changed: false)
        #expect(responder.owner.current == TokenSnapshot(version: 0, token: nil))

        responder.owner.register(deviceToken: [1])
        let json = #"{"code":2,"domain":"D","message":"y"}"#
        try expectChange(
            try responder.send("POST", "/fail", contentType: "application/json", body: utf8(json)),
            token: nil, changed: true)
        #expect(responder.owner.current == TokenSnapshot(version: 2, token: nil))

        try expectChange(try responder.send("POST", "/fail", body: utf8("z")), token: nil, changed: false)
        #expect(responder.owner.version == 2)
        #expect(
            recorder.recorded.map(\.message) == [
                "registration failed: x", "registration failed: D 2: y", "registration failed: z",
            ])
    }

    @Test("the owner and the store decide exactly as PushTokenManager does (the design card)")
    func sameSemanticsAsTheManager() {
        // One random walk of registrations and failures through both: same token, same "changed".
        // Seeded (DrainTests' SplitMix64), so that a failure is the same walk on every run.
        let manager = PushTokenManager(logHandler: quiet)
        let owner = makeOwner()
        var generator = SeededGenerator(state: 0x31)
        for step in 0..<2_000 {
            let before = manager.token
            let outcome: CommitOutcome
            if Int.random(in: 0..<4, using: &generator) == 0 {
                manager.didFailToRegister(error: RegistrationFailure(message: "step \(step)"))
                outcome = commitAtOnce(owner, nil)
            } else {
                let bytes = [UInt8.random(in: 0...2, using: &generator)]
                manager.didRegister(deviceToken: Data(bytes))
                outcome = commitAtOnce(owner, lowerHex(bytes))
            }
            #expect(owner.current.token == manager.token)
            #expect(outcome.changed == (before != manager.token))
        }
    }

    @Test("concurrent writes: one version per change")
    func concurrentWrites() async {
        let owner = makeOwner()
        let changes = Locked<[UInt64]>([])
        await runOnThreads(8) { thread in
            for i in 0..<200 {
                let token = lowerHex([UInt8(thread), UInt8(i)])
                if case .applied(let state) = commitAtOnce(owner, token) {
                    changes.withLock { $0.append(state.version) }
                }
                _ = owner.current
            }
        }
        let versions = changes.withLock { $0 }.sorted()
        #expect(versions == Array(1...1600))
        #expect(owner.version == 1600)
    }
}

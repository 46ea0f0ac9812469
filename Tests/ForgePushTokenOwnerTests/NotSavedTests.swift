import Dispatch
import ForgePushToken
import ForgePushTokenOwnerTestSupport
import ForgePushTokenTestSupport
import Testing

@testable import ForgePushTokenOwner

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// Issue 42, finding 4: a write answered `503 state_not_saved` is neither streamed nor served, and
/// a version once tried is never given to another token, across a restart too, whatever the
/// failed write left on disk.
@Suite struct NotSavedTests {
    typealias Decision = StateFileStore.Decision

    /// A state file's path in a fresh folder, and a remover for both (and a folder at the
    /// temporary name, if a test made one).
    func stateFile() -> (file: StateFile, remove: () -> Void) {
        let dir = GroupCommitTests().folder()
        let file = StateFile(path: dir + "/state.json")
        return (
            file,
            {
                unlink(file.path)
                rmdir(file.temporary)
                rmdir(dir)
            }
        )
    }

    @Test("a batch is decided in arrival order against the state written, each change above every version tried")
    func decide() {
        let a = TokenState(version: 4, token: "aa")
        // Nothing tried above the file: versions follow it.
        #expect(
            StateFileStore.decide(["bb", "bb", "cc", "aa"], from: a, tried: 4)
                == Decision(
                    outcomes: [
                        .applied(TokenState(version: 5, token: "bb")), .unchanged(TokenState(version: 5, token: "bb")),
                        .applied(TokenState(version: 6, token: "cc")), .applied(TokenState(version: 7, token: "aa")),
                    ], state: TokenState(version: 7, token: "aa"), tried: 7))
        // After failed writes tried up to 9: the next change takes 10; the same token is unchanged
        // at the state written, and the batch still tries nothing new.
        #expect(
            StateFileStore.decide(["aa"], from: a, tried: 9)
                == Decision(outcomes: [.unchanged(a)], state: a, tried: 9))
        #expect(
            StateFileStore.decide(["bb"], from: a, tried: 9)
                == Decision(
                    outcomes: [.applied(TokenState(version: 10, token: "bb"))],
                    state: TokenState(version: 10, token: "bb"), tried: 10))
        // No version left: refused, the rest of the batch decided as before.
        let last = TokenState(version: .max - 1, token: "aa")
        #expect(
            StateFileStore.decide(["bb", "cc", "bb"], from: last, tried: .max - 1)
                == Decision(
                    outcomes: [
                        .applied(TokenState(version: .max, token: "bb")), .versionExhausted,
                        .unchanged(TokenState(version: .max, token: "bb")),
                    ],
                    state: TokenState(version: .max, token: "bb"), tried: .max))
        #expect(
            StateFileStore.decide(["bb", nil], from: last, tried: .max)
                == Decision(outcomes: [.versionExhausted, .versionExhausted], state: last, tried: .max))
    }

    @Test("the owner: a write not saved reaches no subscriber and is not served; the retry takes a new version")
    func ownerNeitherStreamsNorServes() throws {
        let (file, remove) = stateFile()
        defer { remove() }
        let store = StateFileStore(file: file)
        let owner = TokenOwner<TokenState>(store: store, initial: try store.load(), maxSubscribers: 2)
        owner.start()
        defer { owner.close() }
        let subscription = try owner.subscribe { id, first in RecordingSubscriber(id: id, first: first) }
        let subscriber = subscription.subscriber
        #expect(commitAndWait(owner, "aa") == .applied(TokenState(version: 1, token: "aa")))
        // A folder where the temporary file goes: the save fails before its rename.
        #expect(mkdir(file.temporary, 0o700) == 0)
        guard case .notSaved(let reason) = commitAndWait(owner, "bb") else {
            Issue.record("expected notSaved")
            return
        }
        #expect(reason.contains(file.temporary))
        #expect(owner.current == TokenState(version: 1, token: "aa"), "a write not saved is served")
        #expect(owner.health == .degraded(reason: HealthReason.stateNotSaved))
        #expect(rmdir(file.temporary) == 0)
        // The next change must be the next thing the subscriber sees, at a version above the
        // one tried (2): a streamed "bb" would come first.
        #expect(commitAndWait(owner, "cc") == .applied(TokenState(version: 3, token: "cc")))
        #expect(
            subscriber.offered == [
                .initial, TokenState(version: 1, token: "aa"), TokenState(version: 3, token: "cc"),
            ])
        #expect(owner.health == .ok)
        #expect(try file.load() == .init(token: "cc", version: 3))
    }

    @Test("a failed write that reached the disk (its folder's fsync failed) names its token alone, after a restart too")
    func renameLandedBeforeTheFailure() throws {
        let (file, remove) = stateFile()
        defer { remove() }
        // What a write of "bb" at version 2 leaves when its rename landed and the folder's fsync
        // then failed: the file holds it, although the writer was answered notSaved.
        try file.save(.init(token: "bb", version: 2))
        let store = StateFileStore(file: file)
        #expect(try store.load() == TokenState(version: 2, token: "bb"))
        let owner = TokenOwner<TokenState>(store: store, initial: try store.load(), maxSubscribers: 1)
        owner.start()
        defer { owner.close() }
        #expect(commitAndWait(owner, "cc") == .applied(TokenState(version: 3, token: "cc")))
    }

    @Test(
        "the version tried is kept across a restart: an unchanged write records it, the next start takes a version above it"
    )
    func triedSurvivesARestart() throws {
        let (file, remove) = stateFile()
        defer { remove() }
        do {
            let store = StateFileStore(file: file)
            let owner = TokenOwner<TokenState>(store: store, initial: try store.load(), maxSubscribers: 1)
            owner.start()
            defer { owner.close() }
            #expect(commitAndWait(owner, "aa") == .applied(TokenState(version: 1, token: "aa")))
            #expect(mkdir(file.temporary, 0o700) == 0)
            #expect(commitAndWait(owner, "bb") != .applied(TokenState(version: 2, token: "bb")))
            #expect(commitAndWait(owner, "cc") != .applied(TokenState(version: 3, token: "cc")))
            #expect(rmdir(file.temporary) == 0)
            // The token served, again: the file may have held another, so it is written, with
            // the highest version tried (3).
            #expect(commitAndWait(owner, "aa") == .unchanged(TokenState(version: 1, token: "aa")))
            #expect(try file.load() == .init(token: "aa", version: 1, tried: 3))
            #expect(owner.health == .ok)
            #expect(commitAndWait(owner, "aa") == .unchanged(TokenState(version: 1, token: "aa")))
        }
        // A restart serves the last acknowledged state, and its first change takes 4, not 2.
        let store = StateFileStore(file: file)
        #expect(try store.load() == TokenState(version: 1, token: "aa"))
        let owner = TokenOwner<TokenState>(store: store, initial: try store.load(), maxSubscribers: 1)
        owner.start()
        defer { owner.close() }
        #expect(commitAndWait(owner, "dd") == .applied(TokenState(version: 4, token: "dd")))
        #expect(try file.load() == .init(token: "dd", version: 4))
    }

    @Test("writes queued behind a failed batch are decided against the state written, not the one that failed")
    func queuedBehindAFailure() throws {
        let (file, remove) = stateFile()
        defer { remove() }
        let store = StateFileStore(file: file)
        _ = try store.load()
        defer { store.stop() }
        let answers = Locked<[Int: CommitOutcome]>([:])
        let group = DispatchGroup()
        func send(_ index: Int, _ token: String?) {
            group.enter()
            store.commitEitherWay(token, base: .initial) { outcome in
                answers.withLock { $0[index] = outcome }
                group.leave()
            }
        }
        #expect(mkdir(file.temporary, 0o700) == 0)
        send(0, "bb")
        #expect(group.wait(timeout: .now() + waitBoundSeconds) == .success)
        #expect(rmdir(file.temporary) == 0)
        // "bb" tried 1. Now "bb" again and "cc": "bb" is a change (the state written has no
        // token), so it takes 2, and "cc" 3.
        send(1, "bb")
        send(2, "cc")
        #expect(group.wait(timeout: .now() + waitBoundSeconds) == .success)
        let outcomes = answers.withLock { $0 }
        guard case .notSaved = outcomes[0] else {
            Issue.record("expected notSaved, got \(String(describing: outcomes[0]))")
            return
        }
        #expect(outcomes[1] == .applied(TokenState(version: 2, token: "bb")))
        #expect(outcomes[2] == .applied(TokenState(version: 3, token: "cc")))
        #expect(try file.load() == .init(token: "cc", version: 3))
    }
}

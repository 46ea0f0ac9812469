import Dispatch
import ForgePushToken
import ForgePushTokenOwnerTestSupport
import Testing

@testable import ForgePushTokenOwner

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// Group commit for `--state-file` (issue 32): writes that arrive while the file is being written
/// are made durable together by the next write, each keeping its own version, and none is
/// answered, or reaches a subscriber, before the file holds it.
@Suite struct GroupCommitTests {
    func folder() -> String {
        var template = Array("/tmp/fpt-group-XXXXXX".utf8CString)
        return template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)) }
    }

    /// A state file in a fresh folder, its store on a queue of its own, and an owner started on it;
    /// `cleanUp` removes the file and the folder.
    func startedOwner() throws -> (
        file: StateFile, store: StateFileStore, owner: TokenOwner<TokenState>, cleanUp: () -> Void
    ) {
        let dir = folder()
        let file = StateFile(path: dir + "/state.json")
        let store = StateFileStore(file: file)
        let owner = TokenOwner<TokenState>(store: store, initial: try store.load(), maxSubscribers: 1)
        owner.start()
        func cleanUp() {
            unlink(file.path)
            rmdir(dir)
        }
        return (file, store, owner, cleanUp)
    }

    /// A state file in a fresh folder, its store on a queue that is held (suspended: the caller
    /// resumes it), so that writes made before wait for the file together, and an owner started
    /// on it; `cleanUp` stops the store and removes the file and the folder.
    func ownerOnHeldQueue(minimumGathering: Duration = .zero) throws -> (
        file: StateFile, store: StateFileStore, owner: TokenOwner<TokenState>, queue: DispatchQueue,
        cleanUp: () -> Void
    ) {
        let dir = folder()
        let file = StateFile(path: dir + "/state.json")
        let queue = DispatchQueue(label: "test.state-file")
        queue.suspend()
        let store = StateFileStore(file: file, queue: queue, minimumGathering: minimumGathering)
        let owner = TokenOwner<TokenState>(store: store, initial: try store.load(), maxSubscribers: 1)
        owner.start()
        func cleanUp() {
            store.stop()
            unlink(file.path)
            rmdir(dir)
        }
        return (file, store, owner, queue, cleanUp)
    }

    /// A subscriber that records every state offered to it.
    final class Recorder: TokenSubscriber, Sendable {
        let id: UInt64
        let seen = Locked<[TokenState]>([])
        init(id: UInt64, first: TokenState) {
            self.id = id
            seen.withLock { $0.append(first) }
        }
        func offer(_ rendition: TokenState) -> Bool {
            seen.withLock { $0.append(rendition) }
            return false
        }
        func heartbeatTick() -> Bool { false }
        func end(_ ending: SubscriberEnding, reason: StreamEndReason) -> Bool { false }
        func wake() {}
    }

    /// `value` as `digits` lowercase hex digits.
    static func hex(_ value: Int, digits: Int = 4) -> String {
        let text = String(value, radix: 16)
        return String(repeating: "0", count: max(0, digits - text.count)) + text
    }

    static func writes(_ store: StateFileStore) -> Int {
        store.status().durableWrites.map { Int($0) } ?? -1
    }

    @Test("writes that wait for the file are written together, each with its own version, answered after the write")
    func writesWaitingForTheFileShareOneWrite() throws {
        // The store's queue is held: every write below waits for the file, as writes that arrive
        // during an fsync do.
        let (file, store, owner, queue, cleanUp) = try ownerOnHeldQueue()
        defer { cleanUp() }
        let subscription = try owner.subscribe { id, first in Recorder(id: id, first: first) }
        let outcomes = Locked<[CommitOutcome]>([])
        let answered = DispatchGroup()
        for index in 0..<20 {
            answered.enter()
            owner.commit(Self.hex(index + 1)) { outcome in
                outcomes.withLock { $0.append(outcome) }
                answered.leave()
            }
        }
        // Nothing is answered, applied, streamed or on disk before the write.
        #expect(outcomes.withLock { $0.isEmpty })
        #expect(owner.current == TokenState(version: 0, token: nil))
        #expect(subscription.subscriber.seen.withLock { $0 } == [TokenState(version: 0, token: nil)])
        #expect(try file.load() == nil)
        queue.resume()
        answered.wait()
        let answers = outcomes.withLock { $0 }
        #expect(
            answers == (1...20).map { .applied(TokenState(version: UInt64($0), token: Self.hex($0))) })
        #expect(Self.writes(store) == 1)
        #expect(try file.load() == .init(token: "0014", version: 20))
        #expect(owner.current == TokenState(version: 20, token: "0014"))
        // Every version reached the subscriber once, in order, after the write.
        #expect(subscription.subscriber.seen.withLock { $0.map(\.version) } == Array(0...20))
    }

    @Test("concurrent writers: every change has its own version, the file holds the last, and writes are batched")
    func concurrentWritersKeepOneVersionPerChange() throws {
        let (file, store, owner, cleanUp) = try startedOwner()
        defer { cleanUp() }
        let versions = Locked<[UInt64]>([])
        DispatchQueue.concurrentPerform(iterations: 8) { thread in
            for index in 0..<50 {
                guard case .applied(let state) = commitAndWait(owner, Self.hex(thread << 16 | index, digits: 6))
                else {
                    Issue.record("a change was not applied")
                    return
                }
                versions.withLock { $0.append(state.version) }
            }
        }
        #expect(versions.withLock { $0.sorted() } == Array(1...400))
        #expect(try file.load()?.version == 400)
        #expect(owner.current.version == 400)
        #expect((1...400).contains(Self.writes(store)))
        // The same token again with nothing waiting (the queue's work item has ended: `stop()`
        // waits for it) is answered at once and writes nothing.
        store.stop()
        let before = Self.writes(store)
        let current = owner.current
        #expect(commitAtOnce(owner, current.token) == .unchanged(current))
        #expect(Self.writes(store) == before)
    }

    @Test("writers that write again once answered are gathered: one file write per round")
    func returningWritersShareOneWritePerRound() throws {
        // The queue is held until every writer's first write waits, so the first batch holds them
        // all; the gathering is held open so that only the writers' return ends it, never time.
        // (`stop()`, in `cleanUp`, ends the last gathering, for which nobody comes back.)
        let (file, store, owner, queue, cleanUp) = try ownerOnHeldQueue(minimumGathering: .seconds(3600))
        defer { cleanUp() }
        let writers = 4
        let rounds = 10
        let versions = Locked<[UInt64]>([])
        let finished = DispatchGroup()
        // Each writer writes again from another thread as soon as it is answered, as a client on
        // a keep-alive connection does.
        @Sendable func write(_ writer: Int, round: Int) {
            owner.commit(Self.hex(writer << 8 | round)) { outcome in
                if case .applied(let state) = outcome {
                    versions.withLock { $0.append(state.version) }
                } else {
                    Issue.record("not applied: \(outcome)")
                }
                if round + 1 < rounds {
                    DispatchQueue.global().async { write(writer, round: round + 1) }
                } else {
                    finished.leave()
                }
            }
        }
        for writer in 0..<writers {
            finished.enter()
            write(writer, round: 0)
        }
        queue.resume()
        finished.wait()
        #expect(Self.writes(store) == rounds)
        #expect(versions.withLock { $0.sorted() } == Array(1...UInt64(writers * rounds)))
        #expect(try file.load()?.version == UInt64(writers * rounds))
    }

    @Test("a gathering ends by itself when the writers do not all come back")
    func gatheringEndsWithoutTheWriters() throws {
        let (file, store, owner, queue, cleanUp) = try ownerOnHeldQueue()
        defer { cleanUp() }
        let answered = DispatchGroup()
        for index in 1...2 {
            answered.enter()
            owner.commit(Self.hex(index)) { _ in answered.leave() }
        }
        queue.resume()
        answered.wait()
        // The writer now gathers for two writes; one comes, and is written all the same.
        #expect(commitAndWait(owner, Self.hex(3)) == .applied(TokenState(version: 3, token: Self.hex(3))))
        #expect(Self.writes(store) == 2)
        #expect(try file.load() == .init(token: Self.hex(3), version: 3))
    }

    /// What this process's open descriptors refer to under `folder` (`/proc/self/fd`); a file
    /// replaced by a rename but still open reads as its old path with " (deleted)".
    static func descriptors(under folder: String) -> [String] {
        guard let listing = opendir("/proc/self/fd") else { return ["cannot list /proc/self/fd"] }
        defer { closedir(listing) }
        var found: [String] = []
        while let entry = readdir(listing) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) {
                String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self)
            }
            var target = [CChar](repeating: 0, count: 4096)
            let count = readlink("/proc/self/fd/" + name, &target, target.count - 1)
            guard count > 0 else { continue }
            let text = String(decoding: target.prefix(count).map { UInt8(bitPattern: $0) }, as: UTF8.self)
            if text.hasPrefix(folder) { found.append(text) }
        }
        return found
    }

    @Test(
        "writes from many threads: every file a rename replaced is closed after its answers, and stop leaves no descriptor open"
    )
    func replacedFilesAreClosed() throws {
        let (file, store, owner, cleanUp) = try startedOwner()
        defer { cleanUp() }
        let dir = String(file.path.dropLast("/state.json".count))
        DispatchQueue.concurrentPerform(iterations: 4) { thread in
            for index in 0..<40 {
                guard case .applied = commitAndWait(owner, Self.hex(thread << 16 | index, digits: 6)) else {
                    Issue.record("a change was not applied")
                    return
                }
            }
        }
        #expect(try file.load()?.version == 160)
        store.stop()
        // The store kept the file in place open (so that replacing it later frees nothing in the
        // writer's way) and closed every replaced one after its answers; stop closed the rest.
        #expect(Self.descriptors(under: dir) == [])
        #expect(access(file.path + ".tmp", F_OK) != 0, "no temporary file is left")
        // A write after stop works as before, and stop closes what it opened.
        #expect(commitAndWait(owner, "abcd") == .applied(TokenState(version: 161, token: "abcd")))
        #expect(try file.load() == .init(token: "abcd", version: 161))
        store.stop()
        #expect(Self.descriptors(under: dir) == [])
    }
}

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

/// `StateFileStore`'s gathering under stress (from an attack on it, issue 32): many writers with random pauses, `stop()` racing
/// commits, failing saves. Every wait is bounded, so that a lost answer fails instead of hanging.
///
/// The pauses and tokens come from a seeded generator: the seed is printed at the start of each
/// test and named in every failure, and `FORGE_STRESS_SEED=N` replays it (the same inputs; the
/// threads' interleaving is the scheduler's).
@Suite struct GroupCommitStressTests {
    /// This run's seed: `FORGE_STRESS_SEED`, or a random one.
    static let seed: UInt64 = {
        if let text = getenv("FORGE_STRESS_SEED"), let seed = UInt64(String(cString: text)) {
            return seed
        }
        return UInt64.random(in: 1...UInt64(UInt32.max))
    }()

    /// Names the seed in failures, and prints it once per test.
    static func seedComment(_ test: String) -> Comment {
        print("GroupCommitStressTests.\(test): seed \(seed) (FORGE_STRESS_SEED=\(seed) replays it)")
        return "seed \(seed) (FORGE_STRESS_SEED=\(seed) replays it)"
    }

    /// A state file's path in a fresh folder (`remove(_:in:)` removes both).
    func stateFile() -> (folder: String, file: StateFile) {
        let dir = GroupCommitTests().folder()
        return (dir, StateFile(path: dir + "/state.json"))
    }

    func remove(_ file: StateFile, in folder: String) {
        unlink(file.path)
        rmdir(folder)
    }

    /// The store's private `gathered` semaphore, found by reflection.
    static func gathered(_ store: StateFileStore) -> DispatchSemaphore? {
        Mirror(reflecting: store).children.first { $0.label == "gathered" }?.value as? DispatchSemaphore
    }

    /// Records every answer: each write's completion must run exactly once, in version order for
    /// the ones on the store's queue, and only when the file holds its version.
    final class Answers: Sendable {
        struct Answer {
            var index: Int
            var outcome: CommitOutcome
            var fileVersion: UInt64?
        }
        let answers = Locked<[Answer]>([])
        let group = DispatchGroup()
    }

    /// Commits from `threads` threads, `perThread` each, with random pauses (and a same-token
    /// write now and then), straight to the store; thread `t` draws them from `SeededGenerator`
    /// seeded with `seed + t`.
    func hammer(
        _ store: StateFileStore, file: StateFile, threads: Int, perThread: Int, answers: Answers, seed: UInt64,
        checkFile: Bool = true
    ) {
        DispatchQueue.concurrentPerform(iterations: threads) { thread in
            var generator = SeededGenerator(state: seed &+ UInt64(thread))
            for index in 0..<perThread {
                // Load shaping, not a wait for an event: a seeded pause of 150 to 300 µs now and
                // then spreads the writes over gatherings; nothing here expects it to let anything
                // happen (issue 47 keeps it).
                let pause = UInt32.random(in: 0..<300, using: &generator)
                if pause > 150 { usleep(pause) }
                // One write in eight proposes a token that is probably the current one.
                let token: String? =
                    Int.random(in: 0..<8, using: &generator) == 0
                    ? "00" : String(0x100000 + (thread << 12 | index), radix: 16)
                answers.group.enter()
                let id = thread * perThread + index
                store.commitEitherWay(token, base: .initial) { outcome in
                    let onDisk = checkFile ? (try? file.load())?.version : nil
                    answers.answers.withLock { $0.append(.init(index: id, outcome: outcome, fileVersion: onDisk)) }
                    answers.group.leave()
                }
            }
        }
    }

    static func version(_ outcome: CommitOutcome) -> UInt64? {
        switch outcome {
        case .applied(let state), .unchanged(let state): state.version
        default: nil
        }
    }

    @Test("many writers with random pauses: every write answered once, after the file holds it; no signal left over")
    func manyWritersRandomPauses() throws {
        let seeded = Self.seedComment("manyWritersRandomPauses")
        let (dir, file) = stateFile()
        defer { remove(file, in: dir) }
        for round in 0..<5 {
            let store = StateFileStore(file: file)
            _ = try store.load()
            let answers = Answers()
            hammer(
                store, file: file, threads: 6, perThread: 150, answers: answers, seed: Self.seed &+ UInt64(round) &* 64)
            #expect(
                answers.group.wait(timeout: .now() + waitBoundSeconds) == .success,
                "a commit was never answered; \(seeded)")
            let all = answers.answers.withLock { $0 }
            #expect(all.count == 900, seeded)
            #expect(Set(all.map(\.index)).count == 900, "a write was answered twice; \(seeded)")
            for answer in all {
                switch answer.outcome {
                case .applied(let state), .unchanged(let state):
                    #expect(
                        (answer.fileVersion ?? 0) >= state.version,
                        "answered \(answer.outcome) while the file held \(String(describing: answer.fileVersion)); \(seeded)"
                    )
                default: Issue.record("unexpected outcome \(answer.outcome); \(seeded)")
                }
            }
            let changed = all.compactMap { answer -> UInt64? in
                if case .applied(let state) = answer.outcome { return state.version }
                return nil
            }
            #expect(Set(changed).count == changed.count, "two changes share a version; \(seeded)")
            // Wait for the writer's item to end (its last gathering times out), then look for a
            // signal left over: it would end the next gathering at once.
            store.stop()
            let semaphore = try #require(Self.gathered(store), seeded)
            #expect(semaphore.wait(timeout: .now()) == .timedOut, "a gathering's signal was left over; \(seeded)")
        }
    }

    @Test("no leftover signal without stop: the item ends by itself, and the semaphore is back at zero")
    func noLeftoverSignalWithoutStop() throws {
        let seeded = Self.seedComment("noLeftoverSignalWithoutStop")
        let (dir, file) = stateFile()
        defer { remove(file, in: dir) }
        let queue = DispatchQueue(label: "stress.state-file")
        for round in 0..<5 {
            let store = StateFileStore(file: file, queue: queue)
            _ = try store.load()
            let answers = Answers()
            hammer(
                store, file: file, threads: 4, perThread: 200, answers: answers, seed: Self.seed &+ UInt64(round) &* 64,
                checkFile: false)
            #expect(
                answers.group.wait(timeout: .now() + waitBoundSeconds) == .success,
                "a commit was never answered; \(seeded)")
            // The writer's last gathering ends by its time limit, then its item: wait for it.
            queue.sync {}
            let semaphore = try #require(Self.gathered(store), seeded)
            #expect(semaphore.wait(timeout: .now()) == .timedOut, "a gathering's signal was left over; \(seeded)")
            store.stop()
        }
    }

    @Test("stop() racing commits: no hang, every commit answered, nothing left open after a quiet stop")
    func stopRacingCommits() throws {
        let seeded = Self.seedComment("stopRacingCommits")
        var stopGenerator = SeededGenerator(state: Self.seed ^ 0x5709)
        let (dir, file) = stateFile()
        defer { remove(file, in: dir) }
        for round in 0..<20 {
            // A long minimum gathering: only the writers' return or stop() ends a gathering.
            let store = StateFileStore(
                file: file, queue: DispatchQueue(label: "stress.\(round)"), minimumGathering: .seconds(3600))
            _ = try store.load()
            let answers = Answers()
            let stopped = DispatchSemaphore(value: 0)
            let stopPause = UInt32.random(in: 0..<3000, using: &stopGenerator)
            DispatchQueue.global().async {
                // Load shaping: the stop lands at a seeded moment among the writes, wherever
                // that is; the test asserts every write's answer whatever the moment.
                usleep(stopPause)
                store.stop()
                stopped.signal()
            }
            hammer(
                store, file: file, threads: 3, perThread: 40, answers: answers, seed: Self.seed &+ UInt64(round) &* 64,
                checkFile: false)
            #expect(stopped.wait(timeout: .now() + waitBoundSeconds) == .success, "stop() hung; \(seeded)")
            #expect(
                answers.group.wait(timeout: .now() + waitBoundSeconds) == .success,
                "a commit was never answered; \(seeded)")
            #expect(answers.answers.withLock { $0.count } == 120, seeded)
            // Stopped again, once quiet: returns at once.
            store.stop()
        }
    }

    @Test("failing saves: notSaved while the folder is gone, no version tried given again once it is back")
    func failingSaves() throws {
        let seeded = Self.seedComment("failingSaves")
        let (dir, file) = stateFile()
        defer { remove(file, in: dir) }
        let store = StateFileStore(file: file)
        defer { store.stop() }
        _ = try store.load()
        func commit(_ token: String?) -> CommitOutcome? {
            let result = Locked<CommitOutcome?>(nil)
            let done = DispatchSemaphore(value: 0)
            store.commitEitherWay(token, base: .initial) { outcome in
                result.withLock { $0 = outcome }
                done.signal()
            }
            guard done.wait(timeout: .now() + waitBoundSeconds) == .success else { return nil }
            return result.withLock { $0 }
        }
        #expect(commit("aa") == .applied(TokenState(version: 1, token: "aa")), seeded)
        unlink(file.path)
        #expect(rmdir(dir) == 0, seeded)
        guard case .notSaved = commit("bb") else {
            Issue.record("expected notSaved; \(seeded)")
            return
        }
        // Many writers while the folder is gone: each answered once, notSaved.
        let answers = Answers()
        hammer(store, file: file, threads: 4, perThread: 50, answers: answers, seed: Self.seed, checkFile: false)
        #expect(answers.group.wait(timeout: .now() + waitBoundSeconds) == .success, seeded)
        #expect(answers.answers.withLock { $0.count } == 200, seeded)
        for answer in answers.answers.withLock({ $0 }) {
            guard case .notSaved = answer.outcome else {
                Issue.record("answered \(answer.outcome) with the folder gone; \(seeded)")
                continue
            }
        }
        // The folder back: "aa" is written again (the file is gone), not answered at once as
        // unchanged, with the highest version tried; then a change takes a version above it.
        #expect(mkdir(dir, 0o700) == 0, seeded)
        #expect(commit("aa") == .unchanged(TokenState(version: 1, token: "aa")), seeded)
        let onDisk = try #require(try file.load(), seeded)
        #expect(onDisk.token == "aa" && onDisk.version == 1, seeded)
        // "bb" tried 2; of the 200 writers, every change (a run of "00"s in one batch is one) tried
        // one more.
        let tried = try #require(onDisk.tried, seeded)
        #expect(tried > 2 && tried <= 202, seeded)
        let current = commit("cc")
        guard case .applied(let now) = current else {
            Issue.record("expected applied, got \(String(describing: current)); \(seeded)")
            return
        }
        #expect(now.version == tried + 1, seeded)
        #expect(try file.load() == .init(token: "cc", version: now.version), seeded)
        #expect(commit("cc") == .unchanged(now), seeded)
    }
}

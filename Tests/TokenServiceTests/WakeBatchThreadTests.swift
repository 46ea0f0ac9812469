import Dispatch
import ForgePushToken
import Testing

@testable import ServerSupport

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// `WakeBatch` behind its raw per-thread pointer: many threads that open batches and
/// end (the key's destructor frees each batch), nested batches, `wake()`s that run batches of
/// their own (deeply, with many targets, so that the buffers grow and are swapped while the outer
/// batch still wakes its own), a target released inside `close()` whose deinit runs a batch, and a
/// batch run from another key's destructor while its thread ends.
///
/// Each body runs on a pthread of its own, joined before the test goes on (so its batch was
/// freed), and reports what it saw as a value: the test's expectations are checked on the test's
/// own task.
@Suite("WakeBatch across threads")
struct WakeBatchThreadTests {
    final class Target: BatchWakeable {
        let wakes = Locked(0)
        func wake() { wakes.withLock { $0 += 1 } }
        var count: Int { wakes.withLock { $0 } }
    }

    /// Runs `body` on a new thread, joins it (its thread-specific values destroyed) and returns
    /// what `body` returned.
    static func onFreshThread<T: Sendable>(_ body: @escaping @Sendable () -> T) -> T {
        let result = Locked<T?>(nil)
        let thread = ThreadBody { result.withLock { $0 = body() } }
        let argument = Unmanaged.passRetained(thread).toOpaque()
        #if canImport(Glibc)
            var handle = pthread_t()
        #else
            var handle: pthread_t?
        #endif
        let created = pthread_create(
            &handle, nil,
            { argument in
                #if canImport(Glibc)
                    Unmanaged<ThreadBody>.fromOpaque(argument!).takeRetainedValue().body()
                #else
                    Unmanaged<ThreadBody>.fromOpaque(argument).takeRetainedValue().body()
                #endif
                return nil
            }, argument)
        precondition(created == 0, "pthread_create failed: \(created)")
        #if canImport(Glibc)
            pthread_join(handle, nil)
        #else
            pthread_join(handle!, nil)
        #endif
        return result.withLock { $0 }!
    }

    final class ThreadBody: Sendable {
        let body: @Sendable () -> Void
        init(_ body: @escaping @Sendable () -> Void) { self.body = body }
    }

    @Test(
        "600 short-lived threads, four at a time, each opening nested batches and ending: every target woken once per batch, none woken outside one"
    )
    func manyThreadsOpenAndEnd() {
        let shared = (0..<8).map { _ in Target() }
        let seen = Locked<[[Int]]>([])
        DispatchQueue.concurrentPerform(iterations: 4) { lane in
            for index in 0..<150 {
                let outcome = Self.onFreshThread { () -> [Int] in
                    let mine = Target()
                    let before = WakeBatch.wakeLater(mine) ? 1 : 0  // a new thread has no batch open
                    var inside = 0
                    for _ in 0..<3 {
                        WakeBatch.run {
                            if WakeBatch.wakeLater(mine) { inside += 1 }
                            WakeBatch.run {
                                _ = WakeBatch.wakeLater(shared[(lane + index) % shared.count])
                                _ = WakeBatch.wakeLater(mine)
                            }
                            _ = WakeBatch.wakeLater(shared[(lane + index) % shared.count])
                        }
                    }
                    let after = WakeBatch.wakeLater(mine) ? 1 : 0
                    return [before, inside, after, mine.count]
                }
                seen.withLock { $0.append(outcome) }
            }
        }
        let outcomes = seen.withLock { $0 }
        #expect(outcomes.count == 600)
        #expect(outcomes.allSatisfy { $0 == [0, 3, 0, 3] }, "\(outcomes.filter { $0 != [0, 3, 0, 3] }.prefix(5))")
        #expect(shared.map(\.count).reduce(0, +) == 600 * 3)
    }

    @Test("a thread that only asks (wakeLater outside any batch) and ends: nothing recorded, nothing freed")
    func threadThatNeverOpens() {
        for _ in 0..<50 {
            let outcome = Self.onFreshThread { () -> [Int] in
                let target = Target()
                return [WakeBatch.wakeLater(target) ? 1 : 0, target.count]
            }
            #expect(outcome == [0, 0])
        }
    }

    /// A target whose `wake()` runs a batch of `fanOut` fresh targets, each of which (down to
    /// `depth`) does the same; what goes wrong is added to `problems`.
    final class Spawner: BatchWakeable {
        let depth: Int
        let fanOut: Int
        let woken: Locked<Int>
        let problems: Locked<[String]>
        let wakes = Locked(0)
        init(depth: Int, fanOut: Int, woken: Locked<Int>, problems: Locked<[String]>) {
            self.depth = depth
            self.fanOut = fanOut
            self.woken = woken
            self.problems = problems
        }
        func wake() {
            wakes.withLock { $0 += 1 }
            woken.withLock { $0 += 1 }
            guard depth > 0 else { return }
            // The batch that woke us is closed: a wake-up asked for now is the caller's to make.
            if WakeBatch.wakeLater(self) { problems.withLock { $0.append("a batch was open inside close()") } }
            let children = (0..<fanOut).map { _ in
                Spawner(depth: depth - 1, fanOut: fanOut, woken: woken, problems: problems)
            }
            WakeBatch.run {
                for child in children {
                    if !WakeBatch.wakeLater(child) || !WakeBatch.wakeLater(child) {
                        problems.withLock { $0.append("no batch open inside run") }
                    }
                }
            }
            for child in children where child.wakes.withLock({ $0 }) != 1 {
                problems.withLock {
                    $0.append("a child of depth \(child.depth) woken \(child.wakes.withLock { $0 }) times")
                }
            }
        }
    }

    @Test(
        "wake()s that run batches of their own, three deep, 40 wide, over grown buffers: every target once; the thread's next batch wakes only its own"
    )
    func reentrantBatchesGrowTheBuffers() {
        let problems = Locked<[String]>([])
        let outcome = Self.onFreshThread { () -> [Int] in
            let woken = Locked(0)
            // Grow both buffers first, so that the nested batches reuse (and swap) grown storage.
            let warm = (0..<300).map { _ in Target() }
            WakeBatch.run { for target in warm { _ = WakeBatch.wakeLater(target) } }
            WakeBatch.run { for target in warm.prefix(200) { _ = WakeBatch.wakeLater(target) } }
            let roots = (0..<40).map { _ in Spawner(depth: 2, fanOut: 6, woken: woken, problems: problems) }
            let plain = (0..<100).map { _ in Target() }
            WakeBatch.run {
                for (index, root) in roots.enumerated() {
                    _ = WakeBatch.wakeLater(root)
                    _ = WakeBatch.wakeLater(plain[index])
                }
                for target in plain[40...] { _ = WakeBatch.wakeLater(target) }
            }
            let rootsOnce = roots.allSatisfy { $0.wakes.withLock { $0 } == 1 } ? 1 : 0
            let plainOnce = plain.allSatisfy { $0.count == 1 } ? 1 : 0
            let total = woken.withLock { $0 }
            let fresh = Target()
            WakeBatch.run { _ = WakeBatch.wakeLater(fresh) }
            let rootsStill = roots.allSatisfy { $0.wakes.withLock { $0 } == 1 } ? 1 : 0
            let plainStill = plain.allSatisfy { $0.count == 1 } ? 1 : 0
            let warmRight = warm.enumerated().allSatisfy { $0.element.count == ($0.offset < 200 ? 2 : 1) } ? 1 : 0
            return [rootsOnce, plainOnce, total, fresh.count, rootsStill, plainStill, warmRight]
        }
        // 40 roots, 240 children, 1,440 grandchildren, each woken once.
        #expect(outcome == [1, 1, 1_720, 1, 1, 1, 1])
        let found = problems.withLock { $0 }
        #expect(found.isEmpty, "\(found.prefix(5))")
    }

    /// A target only the batch holds, whose deinit runs a batch of its own: it runs while
    /// `close()` empties its local array of targets.
    final class DeinitRunsABatch: BatchWakeable {
        let other: Target
        init(other: Target) { self.other = other }
        func wake() {}
        deinit {
            WakeBatch.run { _ = WakeBatch.wakeLater(other) }
        }
    }

    @Test(
        "targets whose last reference is the batch's, and whose deinit runs a batch during close(): each other target woken once, later batches clean"
    )
    func deinitDuringClose() {
        let outcome = Self.onFreshThread { () -> [Int] in
            let others = (0..<50).map { _ in Target() }
            WakeBatch.run {
                for other in others { _ = WakeBatch.wakeLater(DeinitRunsABatch(other: other)) }
            }
            let once = others.allSatisfy { $0.count == 1 } ? 1 : 0
            let fresh = Target()
            WakeBatch.run { _ = WakeBatch.wakeLater(fresh) }
            return [once, fresh.count, others.allSatisfy { $0.count == 1 } ? 1 : 0]
        }
        #expect(outcome == [1, 1, 1])
    }

    /// Another thread-specific value, whose destructor runs a batch as its thread ends (before or
    /// after WakeBatch's own destructor freed the thread's batch).
    static let lateKey: pthread_key_t = {
        var key = pthread_key_t()
        let created = pthread_key_create(&key) { pointer in
            #if canImport(Glibc)
                guard let pointer else { return }
            #endif
            let target = Unmanaged<Target>.fromOpaque(pointer).takeRetainedValue()
            WakeBatch.run { _ = WakeBatch.wakeLater(target) }
        }
        precondition(created == 0, "pthread_key_create failed: \(created)")
        return key
    }()

    @Test("a batch run by another key's destructor while its thread ends: the target is woken, once")
    func batchDuringThreadExit() {
        let targets = (0..<100).map { _ in Target() }
        for (index, target) in targets.enumerated() {
            Self.onFreshThread {
                // Half the threads have a batch (freed at exit) before the late value is set.
                if index % 2 == 0 { WakeBatch.run { _ = WakeBatch.wakeLater(Target()) } }
                pthread_setspecific(Self.lateKey, Unmanaged.passRetained(target).toOpaque())
            }
        }
        #expect(targets.allSatisfy { $0.count == 1 })
    }

    @Test(
        "batches on eight threads at once, all recording the same targets: each batch wakes each target once (nothing shared)"
    )
    func concurrentBatchesShareNothing() {
        let shared = (0..<16).map { _ in Target() }
        DispatchQueue.concurrentPerform(iterations: 8) { _ in
            for _ in 0..<2_000 {
                WakeBatch.run {
                    for target in shared { _ = WakeBatch.wakeLater(target) }
                    WakeBatch.run { for target in shared { _ = WakeBatch.wakeLater(target) } }
                }
            }
        }
        #expect(shared.allSatisfy { $0.count == 8 * 2_000 })
    }
}

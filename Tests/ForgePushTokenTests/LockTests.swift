import ForgePushTokenTestSupport
import Testing

@testable import ForgePushToken

private struct Counter: Sendable {
    var value = 0
    var inside = false
    var overlaps = 0
}

/// `Locked`, the pthread-based box behind the manager's state, tested directly.
@Suite("Locked")
struct LockTests {
    @Test func isExclusiveUnderContention() async {
        let box = Locked(Counter())
        let threads = 8
        let increments = 5_000
        await runOnThreads(threads) { _ in
            for _ in 0..<increments {
                box.withLock { counter in
                    if counter.inside { counter.overlaps += 1 }
                    counter.inside = true
                    counter.value += 1
                    counter.inside = false
                }
            }
        }
        let result = box.withLock { $0 }
        #expect(result.value == threads * increments)
        #expect(result.overlaps == 0)
    }

    @Test func returnsTheBodysResult() {
        let box = Locked([1, 2, 3])
        #expect(box.withLock { $0.count } == 3)
        #expect(
            box.withLock { values -> String in
                values.append(4)
                return "appended"
            } == "appended")
        #expect(box.withLock { $0 } == [1, 2, 3, 4])
    }

    @Test func rethrowsAndUnlocks() {
        let box = Locked(0)
        #expect(throws: TestError.self) {
            try box.withLock { value in
                value = 1
                throw TestError(description: "inside")
            }
        }
        // The throw released the lock, and the mutation before it was kept.
        #expect(box.withLock { $0 } == 1)
    }

    // Exit tests need Swift 6.2 (Xcode 26) and a platform that can spawn the test process
    // (macOS, Linux); with Xcode 16's Swift 6.0 this test is left out.
    #if compiler(>=6.2) && (os(macOS) || os(Linux))
        @Test func reentrantLockingStopsInsteadOfDeadlocking() async {
            await #expect(processExitsWith: .failure) {
                let box = Locked(0)
                box.withLock { _ in
                    box.withLock { $0 += 1 }
                }
            }
        }
    #endif
}

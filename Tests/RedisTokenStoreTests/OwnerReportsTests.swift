import Dispatch
import ForgePushToken
import ForgePushTokenOwner
import ServerSupport
import Testing

@testable import RedisTokenStore

/// The Redis store's way to the owner (`RedisOwnerReports`, `RedisLink`): reports reach the owner
/// in the order they were decided, one delivering thread at a time, and with no lock of the store
/// held (docs/architecture.md, "Locks": the owner's delivery resumes the engine's connections).
@Suite("Redis reports to the owner")
struct OwnerReportsTests {
    private static func changed(_ version: UInt64) -> RedisOwnerReports.Report {
        .owner(.changed(TokenState(version: version, token: nil)))
    }

    @Test("reports queued under one lock by many threads arrive in that order, never two at once")
    func orderedAndOneAtATime() {
        let reports = RedisOwnerReports(log: { _, _ in })
        // Stands for the link machine's lock: the order of decisions is the order of the queue.
        let machine = Locked<UInt64>(0)
        let received = Locked<[UInt64]>([])
        let inside = Locked(0)
        let overlaps = Locked(0)
        reports.start(
            reporting: { event in
                let entered = inside.withLock {
                    $0 += 1
                    return $0
                }
                if entered > 1 { overlaps.withLock { $0 += 1 } }
                if case .changed(let state) = event { received.withLock { $0.append(state.version) } }
                inside.withLock { $0 -= 1 }
            }, current: { .initial })
        let threads = 4
        let each = 500
        DispatchQueue.concurrentPerform(iterations: threads) { _ in
            for _ in 0..<each {
                machine.withLock { decided in
                    decided += 1
                    reports.enqueue([Self.changed(decided)])
                }
                reports.deliver()
            }
        }
        // Every thread has returned, the last one delivering only once the queue was empty.
        #expect(received.withLock { $0 } == Array(1...UInt64(threads * each)))
        #expect(overlaps.withLock { $0 } == 0)
    }

    @Test("the owner's report closure runs with no lock of the reports held: it may send again")
    func reentrantSend() {
        let reports = RedisOwnerReports(log: { _, _ in })
        let received = Locked<[UInt64]>([])
        reports.start(
            reporting: { [weak reports] event in
                // Weakly: the reports keep this closure (a strong capture is a cycle: a leak).
                guard let reports, case .changed(let state) = event else { return }
                received.withLock { $0.append(state.version) }
                // Under a held lock of the reports this would stop at Locked's re-entry check.
                _ = reports.ownerState
                if state.version == 1 { reports.send(Self.changed(2)) }
            }, current: { .initial })
        reports.send(Self.changed(1))
        #expect(received.withLock { $0 } == [1, 2], "the nested report is delivered after, by the same thread")
    }

    @Test("RedisLink reports health and learned states with neither the machine's nor any other lock held")
    func linkReportsWithNoLockHeld() {
        let configuration = RedisTokenStore.Configuration(
            endpoint: RedisEndpoint(address: .tcp(host: "127.0.0.1", port: 1)))
        let lines = Locked<[String]>([])
        let link = RedisLink(configuration: configuration, log: { _, line in lines.withLock { $0.append(line) } })
        let events = Locked<[TokenStoreEvent]>([])
        let owner = Locked(TokenState.initial)
        link.start(
            reporting: { [weak link] event in
                // Weakly: the link keeps this closure (a strong capture would be a cycle, a leak
                // LeakSanitizer reports).
                guard let link else { return }
                // Each of these takes a lock of the link: held by the caller, it would stop at
                // Locked's re-entry check (an error-checking mutex) instead of returning.
                _ = link.health
                _ = link.replicaState
                link.handle { _ in [] }
                events.withLock { $0.append(event) }
                if case .changed(let state) = event { owner.withLock { $0 = state } }
            }, current: { owner.withLock { $0 } })
        link.handle { $0.invalidState(detail: "not a state", at: 0) }
        link.learned(TokenState(version: 3, token: "ab"))
        link.learned(TokenState(version: 3, token: "ab"))
        let seen = events.withLock { $0 }
        #expect(seen.count == 2, "a health report, then the state once: \(seen)")
        #expect(seen.first.map { if case .health = $0 { true } else { false } } == true)
        #expect(seen.last == .changed(TokenState(version: 3, token: "ab")))
        #expect(lines.withLock { $0 }.contains { $0.contains("not a state") }, "the log line is delivered too")
    }
}

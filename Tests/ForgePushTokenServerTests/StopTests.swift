import Dispatch
import ForgePushToken
import ForgePushTokenOwner
import ForgePushTokenOwnerTestSupport
import ForgePushTokenTestSupport
import HTTPServing
import MicroHTTPDServer
import ServerSupport
import Testing
import TokenService

#if canImport(Glibc)
    import Glibc
#endif

extension LiveServerTests {
    /// A stop never aborts libmicrohttpd, whatever the store is doing (issue 42, finding 2): a
    /// write whose store has not answered when the service stops is answered
    /// `503 store_unavailable` before the daemons stop (libmicrohttpd 0.9.75 aborts the process
    /// when stopped with a suspended connection), and a store that does not stop in time does not
    /// hold the shutdown.
    @Suite("A stop with writes in flight")
    struct StopTests {
        /// Runs the shutdown of `live` on another thread with the service's and the engine's clock
        /// `clock`, moving the clock 100 ms at a time, each time once the shutdown waits on it again
        /// (or has ended): returns how far the clock moved, to within the last 100 ms step. No
        /// wall time is read: the whole shutdown after the drain takes at most the grace period
        /// (3 s) of the clock, whatever the store is doing, and that is exact here.
        static func shutdown(_ live: LiveServer, on clock: ManualServerClock) -> Duration {
            let ended = Locked(false)
            let (service, server) = (live.service, live.server)
            DispatchQueue.global().async {
                service.shutdown(engine: server)
                ended.withLock { $0 = true }
            }
            let start = clock.elapsed
            var mark = 0
            while true {
                var over = false
                // A wait begun after the last advance is asleep: the shutdown has looked at the
                // time since, and needs more of it.
                let looked = waitUntil("the shutdown to wait on the clock, or end") {
                    over = ended.withLock { $0 }
                    return over || clock.isWaiting(after: mark)
                }
                guard looked else { break }
                if over { break }
                mark = clock.waitsBegun
                clock.advance(by: .milliseconds(100))
            }
            return clock.elapsed - start
        }

        @Test(
            "writes the store never answers (a hung Redis) are answered 503 store_unavailable; the stop ends",
            arguments: [true, false])
        func hungStore(detached: Bool) throws {
            let store = ScriptedStore(answering: .whenReleased)
            let clock = ManualServerClock()
            let live = try LiveServer(store: store, accessLog: false) {
                $0.detachesStreams = detached
                $0.clock = .manual(clock)
            }
            let writers = try (0..<3).map { _ in try live.client() }
            defer { for writer in writers { writer.close() } }
            for (index, writer) in writers.enumerated() {
                try writer.send("POST /register HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nabc\(index)")
            }
            waitUntil("the writes to reach the store") { store.heldCount == 3 }
            // The grace period less its last second for the writes, then their answers and the store.
            let took = Self.shutdown(live, on: clock)
            #expect(took >= .seconds(2) && took <= .seconds(3), "the shutdown took \(took) of the clock")
            for writer in writers {
                let answer = try writer.readResponse(method: "POST")
                #expect(answer.status == 503)
                #expect(answer.text.contains(#""error":"store_unavailable""#), "\(answer.text)")
                #expect(answer.headers["retry-after"] == "1" && answer.headers["connection"] == "close")
            }
            let logged = live.lines.withLock { $0 }
            #expect(logged.contains { $0.contains("3 writes were still waiting for the token's store") })
            // The store answers after all, after the engine has stopped: nothing is left to answer.
            #expect(store.release() && store.release() && store.release())
        }

        @Test(
            "a store slower than the grace period (a slow fsync), which does not stop in time either",
            arguments: [true, false])
        func slowStore(detached: Bool) throws {
            let store = SlowStoppingStore(answering: .after(.seconds(30)))
            defer { store.finishStopping() }
            let clock = ManualServerClock()
            let live = try LiveServer(store: store, accessLog: false) {
                $0.detachesStreams = detached
                $0.clock = .manual(clock)
            }
            let writer = try live.client()
            defer { writer.close() }
            try writer.send("POST /register HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nabcd")
            waitUntil("the write to reach the store") { store.scripted.proposed.count == 1 }
            // The grace period less its last second, the answer, then the store's 0.5 s in vain.
            let took = Self.shutdown(live, on: clock)
            #expect(took >= .milliseconds(2500) && took <= .seconds(3), "the shutdown took \(took) of the clock")
            let answer = try writer.readResponse(method: "POST")
            #expect(answer.status == 503 && answer.text.contains(#""error":"store_unavailable""#))
            #expect(store.stopCalls.withLock { $0 } == 1)
            #expect(live.lines.withLock { $0 }.contains { $0.contains("the token's store did not stop within") })
        }
    }
}

/// A `ScriptedStore` whose `stop()` blocks until the test lets it go, as a store's would while a
/// state-file save or a Redis round trip it waits for takes seconds.
///
/// Thread-safety: every member may be called from any thread.
final class SlowStoppingStore: TokenStore {
    let scripted: ScriptedStore
    let stopCalls = Locked(0)
    private let stopped = DispatchSemaphore(value: 0)

    init(answering: ScriptedStore.Answering) {
        scripted = ScriptedStore(answering: answering)
    }

    var ordering: CommitOrdering { scripted.ordering }

    func commit(_ token: String?, base: TokenState, completion: @escaping @Sendable (CommitOutcome) -> Void)
        -> CommitOutcome?
    {
        scripted.commit(token, base: base, completion: completion)
    }

    func start(
        reporting report: @escaping @Sendable (TokenStoreEvent) -> Void,
        current: @escaping @Sendable () -> TokenState
    ) {
        scripted.start(reporting: report, current: current)
    }

    /// Blocks until `finishStopping()`; fails the test if that has not come within
    /// `waitBoundSeconds` (a guard against a hang).
    func stop() {
        stopCalls.withLock { $0 += 1 }
        if stopped.wait(timeout: .now() + waitBoundSeconds) == .timedOut {
            Issue.record("waited \(Int(waitBoundSeconds)) s (waitBoundSeconds) for finishStopping(), in vain")
        }
    }

    /// Lets `stop()` return.
    func finishStopping() { stopped.signal() }
}

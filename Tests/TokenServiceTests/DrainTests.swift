import Dispatch
import ForgePushToken
import ForgePushTokenOwner
import ForgePushTokenOwnerTestSupport
import ForgePushTokenTestSupport
import Foundation
import HTTPServing
import ServerSupport
import Testing

@testable import TokenService

/// The most moments of `seconds` (sorted) inside any half-open 100 ms slice.
func busiest100ms(_ seconds: [Double]) -> Int { busiest(seconds, within: 0.1) }

/// The most moments of `seconds` (sorted) inside any half-open slice of `span` seconds.
func busiest(_ seconds: [Double], within span: Double) -> Int {
    var most = 0
    var low = 0
    for high in seconds.indices {
        // 1 ns of slack: t + 0.1 - t is not always 0.1 in binary floating point.
        while seconds[high] - seconds[low] >= span - 1e-9 { low += 1 }
        most = max(most, high - low + 1)
    }
    return most
}

/// The drain window's schedule as a value (../shared/spec/deploy.md, "Draining", step 2).
@Suite struct DrainScheduleTests {
    @Test("no streams: nothing to end, but the window lasts N seconds (issue 42 finding 6); N = 0: over at once")
    func nothingToDrain() {
        var generator = SeededGenerator(state: 1)
        var empty = DrainSchedule(streams: [], seconds: 600, using: &generator)
        #expect(empty.advance(toSeconds: 0) == DrainSchedule.Step(end: [], next: .wake(atSeconds: 600)))
        #expect(empty.advance(toSeconds: 599.9) == DrainSchedule.Step(end: [], next: .wake(atSeconds: 600)))
        #expect(empty.advance(toSeconds: 600) == DrainSchedule.Step(end: [], next: .finished))
        var cut = DrainSchedule(streams: [], seconds: 600, using: &generator)
        #expect(cut.secondSignal() == DrainSchedule.Step(end: [], next: .finished))
        var zero = DrainSchedule(streams: [1, 2, 3], seconds: 0, using: &generator)
        #expect(zero.moments.isEmpty)
        #expect(zero.advance(toSeconds: 0) == DrainSchedule.Step(end: [], next: .finished))
    }

    @Test(
        "every stream once, the k-th in its own slot [k N/S, (k+1) N/S), in random order, within the 100 ms bound",
        arguments: [(2000, 10.0), (10_000, 10.0), (1000, 5.0), (3, 600.0), (5, 10.0), (40, 10.0), (77, 7.0)])
    func slots(streams count: Int, seconds: Double) {
        for seed in UInt64(1)...20 {
            var generator = SeededGenerator(state: seed)
            let ids = (0..<UInt64(count)).map { $0 * 7 + 3 }
            let schedule = DrainSchedule(streams: ids, seconds: seconds, using: &generator)
            #expect(Set(schedule.moments.map(\.id)) == Set(ids) && schedule.moments.count == count)
            let slot = seconds / Double(count)
            for (index, moment) in schedule.moments.enumerated() {
                #expect(moment.seconds >= Double(index) * slot && moment.seconds < Double(index + 1) * slot)
            }
            let bound = DrainSchedule.maxEndsPer100ms(streams: count, seconds: seconds)
            #expect(busiest100ms(schedule.moments.map(\.seconds)) <= bound)
            if count >= 40 {
                #expect(schedule.moments.map(\.id) != ids, "the order is random, not the order given")
            }
        }
    }

    @Test("the bound: max(1, ⌈2 × S × 0.1 / N⌉)")
    func bound() {
        #expect(DrainSchedule.maxEndsPer100ms(streams: 2000, seconds: 10) == 40)
        #expect(DrainSchedule.maxEndsPer100ms(streams: 10_000, seconds: 10) == 200)
        #expect(DrainSchedule.maxEndsPer100ms(streams: 3, seconds: 600) == 1)
        #expect(DrainSchedule.maxEndsPer100ms(streams: 51, seconds: 10) == 2)
    }

    @Test("advance hands out what is due, once, in time order, and names the next moment")
    func advance() {
        var generator = SeededGenerator(state: 7)
        var schedule = DrainSchedule(streams: Array(0..<100), seconds: 10, using: &generator)
        let moments = schedule.moments
        var handed: [UInt64] = []
        var step = schedule.advance(toSeconds: 0)
        while true {
            handed += step.end
            guard case .wake(let at) = step.next, handed.count < moments.count else { break }
            #expect(at == moments[handed.count].seconds, "the next wake is the next moment")
            step = schedule.advance(toSeconds: at)
            #expect(!step.end.isEmpty, "waking at a moment ends its stream")
        }
        #expect(handed == moments.map(\.id))
        #expect(schedule.remaining.isEmpty)
        #expect(step.next == .wake(atSeconds: 10), "every stream ended before N: the window still lasts N")
        #expect(schedule.advance(toSeconds: 100) == DrainSchedule.Step(end: [], next: .finished))
    }

    @Test("a late wake-up hands out what is due at no more than the bound per 100 ms, nothing twice, nothing lost")
    func lateWake() {
        var generator = SeededGenerator(state: 9)
        var schedule = DrainSchedule(streams: Array(0..<2000), seconds: 10, using: &generator)
        #expect(schedule.bound == 40)
        // Woken 2.5 s into the window (about 500 ends due): 40 now, the next batch 100 ms later.
        let first = schedule.advance(toSeconds: 2.5)
        #expect(first.end == schedule.moments.prefix(40).map(\.id))
        #expect(first.next == .wake(atSeconds: 2.6))
        #expect(schedule.advance(toSeconds: 2.55).end.isEmpty, "not before 100 ms have passed")
        var handed = first.end
        var times = [Double](repeating: 2.5, count: 40)
        var clock = 2.6
        while true {
            let step = schedule.advance(toSeconds: clock)
            handed += step.end
            times += [Double](repeating: clock, count: step.end.count)
            guard case .wake(let at) = step.next, !schedule.remaining.isEmpty else { break }
            #expect(at > clock)
            clock = at
        }
        #expect(handed == schedule.moments.map(\.id), "every stream once, in order")
        #expect(busiest100ms(times) <= 40)
        #expect(clock < 10 + 2.5, "it catches up: at twice the even rate, within the lateness")
    }

    @Test("a second signal ends the window at once: nothing more is handed out, the rest are listed")
    func secondSignal() {
        var generator = SeededGenerator(state: 3)
        var schedule = DrainSchedule(streams: Array(0..<10), seconds: 10, using: &generator)
        var early = schedule.advance(toSeconds: 0).end
        for second in 1...3 { early += schedule.advance(toSeconds: Double(second)).end }
        #expect(early.count == 3, "one stream a second, as the slots say")
        #expect(schedule.remaining.count == 7)
        #expect(schedule.secondSignal() == DrainSchedule.Step(end: [], next: .finished))
        #expect(schedule.cutShort)
        #expect(schedule.advance(toSeconds: 10) == DrainSchedule.Step(end: [], next: .finished))
    }
}

/// Each stream's age limit (../shared/spec/deploy.md, "Stream age").
@Suite struct StreamAgeLimitTests {
    @Test("each limit is drawn from [A/2, A], and the draws spread over it")
    func draws() {
        let limits = StreamAgeLimits(seconds: 60)
        var generator = SeededGenerator(state: 11)
        let draws = (0..<10_000).map { _ in limits.drawLimit(using: &generator) }
        #expect(draws.allSatisfy { $0 >= .seconds(30) && $0 <= .seconds(60) })
        #expect(draws.min()! < .seconds(31) && draws.max()! > .seconds(59))
        let below45 = draws.filter { $0 < .seconds(45) }.count
        #expect((4500...5500).contains(below45), "uniform: about half below the middle, got \(below45)")
    }

    @Test("due hands out each stream once, when its deadline has come; a closed stream never")
    func due() {
        var limits = StreamAgeLimits(seconds: 60)
        let start = ContinuousClock.now
        limits.opened(1, at: start, limit: .seconds(30))
        limits.opened(2, at: start, limit: .seconds(45))
        limits.opened(3, at: start, limit: .seconds(60))
        limits.closed(2)
        #expect(limits.due(at: start + .seconds(29)) == [])
        #expect(limits.due(at: start + .seconds(30)) == [1])
        #expect(limits.due(at: start + .seconds(50)) == [])
        #expect(limits.due(at: start + .seconds(70)) == [3])
        #expect(limits.deadlines.isEmpty)
    }

    @Test("the bound: max(1, ⌈2 × S × 0.1 / (A / 2)⌉)")
    func bound() {
        #expect(StreamAgeLimits.maxEndsPer100ms(streams: 10_000, seconds: 60) == 67)
        #expect(StreamAgeLimits.maxEndsPer100ms(streams: 200, seconds: 60) == 2)
        #expect(StreamAgeLimits.maxEndsPer100ms(streams: 5, seconds: 60) == 1)
        #expect(StreamAgeLimits.maxEndsPer100ms(streams: 10_000, seconds: 3600) == 2)
    }

    @Test(
        "paced (issue 42 finding 5): streams under A = 60 ticked every 50 ms end within the bound, each once, soon after their limit",
        arguments: [(10_000, 60), (200, 60), (5, 60)])
    func paced(streams count: Int, seconds: Int) {
        var limits = StreamAgeLimits(seconds: seconds)
        var generator = SeededGenerator(state: 5)
        let start = ContinuousClock.now
        var deadline: [UInt64: Duration] = [:]
        for id in 0..<UInt64(count) {
            let limit = limits.drawLimit(using: &generator)
            deadline[id] = limit
            limits.opened(id, at: start, limit: limit)
        }
        let bound = StreamAgeLimits.maxEndsPer100ms(streams: count, seconds: seconds)
        var ended: [UInt64: Double] = [:]
        var times: [Double] = []
        for tick in 0...(seconds * 20 + 100) {
            let now = start + .milliseconds(tick * 50)
            for id in limits.due(at: now) {
                #expect(ended[id] == nil, "stream \(id) handed out twice")
                #expect(now - start >= deadline[id]!, "stream \(id) ended before its limit")
                ended[id] = Double(tick) / 20
                times.append(Double(tick) / 20)
            }
        }
        #expect(ended.count == count, "every stream ends by age")
        #expect(busiest100ms(times) <= bound, "the burst the old once-a-second sweep made")
        #expect(busiest(times, within: 0.2) <= bound, "the margin for the ends' way to their clients")
        let lateness = ended.map { id, at in at - Double(deadline[id]!.components.seconds) - 1 }.max() ?? 0
        #expect(lateness < 2, "a stream ended \(lateness) s after its limit")
    }

    @Test("a burst: 5 limits passed in the same instant end one per 200 ms (100 ms and the margin), oldest first")
    func burst() {
        var limits = StreamAgeLimits(seconds: 60)
        let start = ContinuousClock.now
        for id in UInt64(1)...5 { limits.opened(id, at: start, limit: .milliseconds(30_000 + Int64(id))) }
        #expect(limits.due(at: start + .seconds(31)) == [1])
        #expect(limits.due(at: start + .milliseconds(31_150)) == [], "not before 200 ms have passed")
        #expect(limits.due(at: start + .milliseconds(31_200)) == [2])
        #expect(limits.due(at: start + .milliseconds(31_400)) == [3])
        #expect(limits.due(at: start + .seconds(40)) == [4])
        #expect(limits.deadlines.keys.sorted() == [5])
    }

    @Test("a drain takes over: after stop() nothing ends by age and nothing new is kept")
    func stopped() {
        var limits = StreamAgeLimits(seconds: 60)
        let start = ContinuousClock.now
        limits.opened(1, at: start, limit: .seconds(30))
        limits.stop()
        limits.opened(2, at: start, limit: .seconds(30))
        #expect(limits.isStopped && limits.deadlines.isEmpty)
        #expect(limits.due(at: start + .seconds(100)) == [])
    }

    @Test("off (0): nothing is kept")
    func off() {
        var limits = StreamAgeLimits(seconds: 0)
        #expect(!limits.isEnabled)
        limits.opened(1, at: .now, limit: .seconds(1))
        #expect(limits.deadlines.isEmpty && limits.due(at: .now + .seconds(100)) == [])
    }
}

/// An engine that records the steps `Service.shutdown(engine:)` asks of it.
final class RecordingEngine: ServiceEngine {
    let steps = Locked<[String]>([])
    let service: Locked<Service?> = Locked(nil)
    /// What the responder said at the first step: draining, stopping, and each stream's reason.
    let atQuiesce = Locked<(draining: Bool, stopping: Bool)?>(nil)

    func quiesce() {
        steps.withLock { $0.append("quiesce") }
        if let service = service.withLock({ $0 }) {
            atQuiesce.withLock { $0 = (service.responder.streams.isDraining, service.owner.isStopping) }
        }
    }
    func awaitIdle() { steps.withLock { $0.append("awaitIdle") } }
    func stop() { steps.withLock { $0.append("stop") } }
}

/// `Service.shutdown(engine:)`: the one shutdown order (issue 31) with the drain of
/// ../shared/spec/deploy.md.
@Suite struct ServiceShutdownTests {
    func service(drainSeconds: Int, clock: ServerClock = .monotonic) -> Service {
        Service(
            store: MemoryTokenStore(), settings: .init(maxSubscribers: 64, drainSeconds: drainSeconds, clock: clock))
    }

    @Test("without a drain: streams end (shutdown), then quiesce, the grace period, stop; readiness says shutting_down")
    func withoutDrain() throws {
        let service = service(drainSeconds: 0)
        let engine = RecordingEngine()
        engine.service.withLock { $0 = service }
        let stream = try #require(service.responder.openEventStream {}.1)
        service.shutdown(engine: engine)
        #expect(engine.steps.withLock { $0 } == ["quiesce", "awaitIdle", "stop"])
        #expect(engine.atQuiesce.withLock { $0 }.map { !$0.draining && $0.stopping } == true)
        #expect(stream.endReason == .shutdown)
        guard case .response(let ready) = service.responder.respond(to: HTTPRequest(method: "GET", target: "/readyz"))
        else { throw Unexpected(description: "/readyz answered no response") }
        #expect(ready.status == 503 && string(ready.body) == #"{"status":"shutting_down"}"#)
        service.shutdown(engine: engine)  // once only
        #expect(engine.steps.withLock { $0 }.count == 3)
    }

    @Test("with a drain: readiness off, every open stream ended by the drain before the engine stops accepting")
    func drainEndsEveryStream() throws {
        let clock = ManualServerClock()
        let service = service(drainSeconds: 1, clock: .manual(clock))
        let engine = RecordingEngine()
        engine.service.withLock { $0 = service }
        let wakes = Counter()
        let streams = try (0..<20).map { _ in try #require(service.responder.openEventStream { wakes.increment() }.1) }
        for stream in streams { #expect(drain(stream).result == .suspended) }
        let done = DispatchSemaphore(value: 0)
        DispatchQueue.global().async {
            service.shutdown(engine: engine)
            done.signal()
        }
        // The drain's window passes on the clock, 100 ms at a time.
        waitUntil("the drain to end every stream and the shutdown to finish") {
            clock.advance(by: .milliseconds(100))
            return done.wait(timeout: .now()) == .success
        }
        #expect(engine.steps.withLock { $0 } == ["quiesce", "awaitIdle", "stop"])
        #expect(engine.atQuiesce.withLock { $0 }.map { $0.draining && $0.stopping } == true)
        #expect(streams.allSatisfy { $0.endReason == .drain })
        #expect(wakes.value == 20, "each suspended stream is woken once, to end")
    }

    @Test("with a drain and no streams: the whole window (issue 42 finding 6); a second signal cuts it short")
    func drainWithoutStreams() throws {
        // On a manual clock: the window lasts until the clock has moved its whole second.
        let clock = ManualServerClock()
        let quiet = service(drainSeconds: 1, clock: .manual(clock))
        let engine = RecordingEngine()
        let ended = DispatchSemaphore(value: 0)
        DispatchQueue.global().async {
            quiet.shutdown(engine: engine)
            ended.signal()
        }
        waitUntil("the drain to wait on the clock") { clock.isWaiting(after: 0) }
        clock.advance(by: .milliseconds(999))
        // The drain looked at the clock again, and waits again: the window is not over.
        waitUntil("the drain to wait again at 999 ms") { clock.isWaiting(after: 1) }
        #expect(ended.wait(timeout: .now()) == .timedOut, "the window collapsed with no streams")
        #expect(engine.steps.withLock { $0 }.isEmpty)
        clock.advance(by: .milliseconds(1))
        #expect(ended.wait(timeout: .now() + waitBoundSeconds) == .success, "the drain outlived its window")
        #expect(engine.steps.withLock { $0 } == ["quiesce", "awaitIdle", "stop"])

        let waiting = service(drainSeconds: 600)
        let done = DispatchSemaphore(value: 0)
        DispatchQueue.global().async {
            waiting.shutdown(engine: RecordingEngine())
            done.signal()
        }
        waitUntil(#"waiting.responder.streams.isDraining"#) { waiting.responder.streams.isDraining }
        waiting.hurry()
        #expect(
            done.wait(timeout: .now() + waitBoundSeconds) == .success,
            "a second signal did not end a drain with no streams")

        let hurried = service(drainSeconds: 600)
        let streams = try (0..<5).map { _ in try #require(hurried.responder.openEventStream {}.1) }
        hurried.hurry()
        hurried.shutdown(engine: RecordingEngine())
        #expect(streams.allSatisfy { $0.endReason == .shutdown })
    }
}

/// The probes and the draining responder (../shared/spec/deploy.md, "Probes", "Draining").
@Suite struct ProbeAndDrainingResponderTests {
    func get(_ responder: Responder, _ path: String) -> HTTPResponse {
        guard case .response(let response) = responder.respond(to: HTTPRequest(method: "GET", target: path)) else {
            Issue.record("\(path) answered something other than a response")
            return HTTPResponse(status: 0)
        }
        return response
    }

    @Test(
        "/livez: 200 ok whatever the store and the phase; /readyz: /healthz's answer, then 503 draining; neither waits for a write with the store"
    )
    func probes() throws {
        let store = ScriptedStore(answering: .whenReleased)
        let service = Service(store: store, health: .starting(reason: HealthReason(rawValue: "connecting")))
        let responder = service.responder
        #expect(get(responder, "/livez").status == 200)
        #expect(string(get(responder, "/livez").body) == #"{"status":"ok"}"#)
        let starting = get(responder, "/readyz")
        #expect(starting.status == 503 && starting.body == get(responder, "/healthz").body)
        store.report(.health(.ok))
        // A write the store holds (as a hung Redis would): the probes answer all the same.
        guard case .later = responder.respond(to: HTTPRequest(method: "POST", target: "/register", body: utf8("abcd")))
        else { throw Unexpected(description: "the write was answered at once") }
        #expect(store.heldCount == 1)
        #expect(get(responder, "/readyz").status == 200)
        #expect(get(responder, "/readyz").body == get(responder, "/healthz").body)
        responder.streams.beginDraining()
        for path in ["/readyz", "/healthz"] {
            #expect(get(responder, path).status == 503)
            #expect(string(get(responder, path).body) == #"{"status":"draining"}"#)
        }
        #expect(get(responder, "/livez").status == 200)
        let metrics = string(get(responder, "/metrics").body)
        #expect(metrics.contains("\nforge_push_token_draining 1\n"))
        store.release()
    }

    @Test("a new stream while draining: 200, retry:, its event, then the end (reason drain)")
    func newStreamWhileDraining() throws {
        let responder = makeResponder()
        responder.owner.register(deviceToken: tokenBytes(32))
        responder.streams.beginDraining()
        let (head, subscriber) = responder.openEventStream {}
        #expect(head.status == 200)
        let stream = try #require(subscriber)
        let read = drain(stream)
        #expect(read.result == .endOfStream)
        let text = string(read.bytes)
        #expect(text.hasPrefix("retry: "))
        #expect(text.hasSuffix(expectedEvent(1, lowerHex(tokenBytes(32)))))
        #expect(stream.endReason == .drain)
        responder.streams.ended(stream)
        let metrics = string(get(responder, "/metrics").body)
        #expect(metrics.contains("\nforge_push_token_streams_ended_total{reason=\"drain\"} 1\n"))
    }

    @Test("streams_ended_total: all five reasons are defined from the start; each end counts once")
    func endedCounters() throws {
        let responder = makeResponder()
        var metrics = string(get(responder, "/metrics").body)
        for reason in ["client", "drain", "age", "shutdown", "revoked"] {
            #expect(metrics.contains("\nforge_push_token_streams_ended_total{reason=\"\(reason)\"} 0\n"))
        }
        #expect(metrics.contains("\nforge_push_token_draining 0\n"))
        let left = try #require(responder.openEventStream {}.1)
        responder.streams.ended(left)  // nothing asked it to end: its client went away
        let revoked = try #require(responder.openEventStream {}.1)
        responder.owner.finish(revoked.id, reason: .revoked)
        responder.owner.abort(revoked.id)  // the first reason sticks
        responder.streams.ended(revoked)
        metrics = string(get(responder, "/metrics").body)
        #expect(metrics.contains("\nforge_push_token_streams_ended_total{reason=\"client\"} 1\n"))
        #expect(metrics.contains("\nforge_push_token_streams_ended_total{reason=\"revoked\"} 1\n"))
    }

    @Test("a stream past its age ends cleanly after its event (reason age); one closed before is forgotten")
    func streamAge() throws {
        let clock = ManualServerClock()
        let service = Service(store: MemoryTokenStore(), settings: .init(maxStreamAge: 60, clock: .manual(clock)))
        let responder = service.responder
        #expect(responder.streams.limitsStreamAge)
        let old = try #require(responder.openEventStream {}.1)
        let gone = try #require(responder.openEventStream {}.1)
        responder.streams.ended(gone)
        // Its limit is drawn from [30 s, 60 s].
        clock.advance(by: .milliseconds(29_999))
        responder.streams.endStreamsPastTheirAge()
        #expect(old.endReason == nil)
        clock.advance(by: .milliseconds(30_001))
        responder.streams.endStreamsPastTheirAge()
        #expect(old.endReason == .age)
        #expect(gone.endReason == nil)
        let read = drain(old)
        #expect(read.result == .endOfStream && eventIDs(read.bytes) == [0])
        #expect(!makeResponder().streams.limitsStreamAge)
    }

    @Test("once the drain begins, no stream ends by age: the drain ends every one (issue 42 finding 5)")
    func drainTakesOverFromAge() throws {
        let clock = ManualServerClock()
        let service = Service(
            store: MemoryTokenStore(), settings: .init(drainSeconds: 1, maxStreamAge: 60, clock: .manual(clock)))
        let responder = service.responder
        let streams = try (0..<5).map { _ in try #require(responder.openEventStream {}.1) }
        let done = DispatchSemaphore(value: 0)
        DispatchQueue.global().async {
            service.shutdown(engine: RecordingEngine())
            done.signal()
        }
        waitUntil(#"responder.streams.isDraining"#) { responder.streams.isDraining }
        waitUntil("the drain to wait on the clock") { clock.isWaiting(after: 0) }
        clock.advance(by: .seconds(61))  // every age limit has passed, and the drain's window
        responder.streams.endStreamsPastTheirAge()
        // The drain, woken late, paces what is due (`DrainSchedule`): the clock moves on 100 ms
        // at a time until it is over.
        waitUntil("the drain to end every stream and the shutdown to finish") {
            clock.advance(by: .milliseconds(100))
            return done.wait(timeout: .now()) == .success
        }
        #expect(streams.allSatisfy { $0.endReason == .drain }, "\(streams.map(\.endReason))")
    }
}

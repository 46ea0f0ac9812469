import HTTPServing
import ServerSupport

/// When a stopping replica ends each of its event streams during its drain window
/// (`--drain-seconds`; docs/operations.md, "Draining", step 2): a plain value with no
/// lock, no clock and no I/O. `Service` runs it: it asks `advance(toSeconds:)` what is due, ends
/// those streams cleanly (`TokenOwner.finish(_:reason:)` with `.drain`) and sleeps until the
/// moment the step names, or until a second signal (`secondSignal()`).
///
/// The S streams open when the signal came are ended in random order at evenly spaced moments:
/// the k-th (k from 0) at (k + Uₖ) × N / S seconds, each Uₖ uniform. So each slot of N / S
/// seconds holds exactly one end, and no 100 ms slice of the window holds more than
/// `maxEndsPer100ms` = max(1, ⌈2 × S × 0.1 / N⌉). Where a slot is 200 ms or wider (S ≤ 5 N),
/// two neighbours could otherwise fall within 100 ms of each other (Uₖ near 1, Uₖ₊₁ near 0),
/// which that bound of 1 forbids: there each Uₖ is drawn from [0, 1 − 0.1 / slot), which keeps
/// neighbours more than 100 ms apart; narrower slots draw from [0, 1) as the spec writes it.
///
/// The bound holds for the moments streams are actually ended, too: a caller that wakes late (a
/// busy machine) is handed what is due at no more than `maxEndsPer100ms` per 100 ms, the rest a
/// little later, rather than in one burst.
///
/// The window lasts its N seconds whatever the number of streams, none included: the service keeps
/// its listening socket open and serves through it, for a load balancer that has not yet seen
/// readiness turn off (docs/operations.md, "Draining"). Only a second signal cuts it short.
///
/// Thread-safety: a `Sendable` value; mutate it from one thread.
public struct DrainSchedule: Sendable, Equatable {
    /// One stream's moment: seconds into the window, and the subscriber to end then.
    public struct Moment: Sendable, Equatable {
        /// Seconds from the start of the window.
        public var seconds: Double
        /// The subscriber's id (`TokenOwner.subscriberIDs`).
        public var id: UInt64
    }

    /// What to do next, after ending `end`.
    public enum Next: Sendable, Equatable {
        /// Call `advance(toSeconds:)` again at this many seconds into the window.
        case wake(atSeconds: Double)
        /// The window is over (its N seconds have passed, or a second signal came): go on with
        /// shutdown (the remaining streams end there, as `StreamEndReason.shutdown`).
        case finished
    }

    /// One step of the schedule: the streams to end now, in order, and what comes next.
    public struct Step: Sendable, Equatable {
        /// Subscriber ids to end cleanly now (`StreamEndReason.drain`).
        public var end: [UInt64]
        /// When to ask again, or that the drain is over.
        public var next: Next
    }

    /// The window, in seconds (N).
    public let seconds: Double
    /// Every stream's moment, in time order.
    public let moments: [Moment]
    /// How many moments have been handed out.
    public private(set) var handedOut = 0
    /// Whether a second signal cut the window short.
    public private(set) var cutShort = false
    /// The most ends handed out in any 100 ms (`maxEndsPer100ms` of this schedule).
    public let bound: Int
    /// When the last `bound` ends were handed out (seconds into the window), a ring: `recent[next]`
    /// is the oldest once it is full.
    private var recent: [Double] = []
    private var next = 0

    /// A schedule over `streams` (the subscribers open when the signal came) for a window of
    /// `seconds` (N ≥ 0), its order and its Uₖ drawn from `generator`. With no streams it has no
    /// moments but still lasts N seconds; a window of 0 is over at once.
    public init(streams: [UInt64], seconds: Double, using generator: inout some RandomNumberGenerator) {
        self.seconds = max(0, seconds)
        self.bound = Self.maxEndsPer100ms(streams: streams.count, seconds: max(0, seconds))
        let order = streams.shuffled(using: &generator)
        let count = Double(order.count)
        guard self.seconds > 0, !order.isEmpty else {
            moments = []
            return
        }
        let slot = self.seconds / count
        let widest = slot >= 0.2 ? 1 - 0.1 / slot : 1
        moments = order.enumerated().map { index, id in
            Moment(seconds: (Double(index) + Double.random(in: 0..<widest, using: &generator)) * slot, id: id)
        }
    }

    /// The most ends any 100 ms slice of the window holds: max(1, ⌈2 × S × 0.1 / N⌉)
    /// (docs/operations.md, "Draining").
    public static func maxEndsPer100ms(streams: Int, seconds: Double) -> Int {
        guard seconds > 0 else { return max(1, streams) }
        return max(1, Int((2 * Double(streams) * 0.1 / seconds).rounded(.up)))
    }

    /// `elapsed` seconds of the window have passed: the streams whose moment has come and not
    /// been handed out (at most `bound` in any 100 ms of hand-outs), and when to ask next: the
    /// next moment, or, once every stream is handed out, the window's end (N), after which the
    /// step is `.finished`.
    public mutating func advance(toSeconds elapsed: Double) -> Step {
        guard !cutShort else { return Step(end: [], next: .finished) }
        var due: [UInt64] = []
        while handedOut < moments.count, moments[handedOut].seconds <= elapsed, mayHandOut(at: elapsed) {
            due.append(moments[handedOut].id)
            handedOut += 1
            record(elapsed)
        }
        guard handedOut < moments.count else {
            return Step(end: due, next: elapsed >= seconds ? .finished : .wake(atSeconds: seconds))
        }
        var wake = moments[handedOut].seconds
        if recent.count == bound { wake = max(wake, recent[self.next] + 0.1) }
        return Step(end: due, next: .wake(atSeconds: wake))
    }

    /// Whether one more end at `elapsed` keeps every 100 ms at `bound` or fewer: the `bound`-th
    /// end before it was handed out 100 ms ago or more.
    private func mayHandOut(at elapsed: Double) -> Bool {
        // The same sum as the wake-up `advance` names, so that waking at it always hands one out.
        recent.count < bound || elapsed >= recent[next] + 0.1
    }

    private mutating func record(_ elapsed: Double) {
        if recent.count < bound {
            recent.append(elapsed)
        } else {
            recent[next] = elapsed
            next = (next + 1) % bound
        }
    }

    /// A second `SIGTERM` or `SIGINT`: the window is over at once. Nothing more is handed out; the
    /// streams not yet ended end in shutdown's next step, all at once.
    public mutating func secondSignal() -> Step {
        cutShort = true
        return Step(end: [], next: .finished)
    }

    /// The ids whose moment has not been handed out.
    public var remaining: [UInt64] { moments[handedOut...].map(\.id) }
}

/// Each event stream's own age limit (`--max-stream-age A`; docs/operations.md, "Stream
/// age"): drawn uniformly from [A/2, A] when the stream opens, so that the streams of a fleet
/// end at spread-out moments and reconnect through the load balancer, which gives replicas added
/// by a scale-out their share. A plain value with no clock: `Responder` keeps it behind its own
/// lock and asks `due(at:)` every `tickMilliseconds` (50 ms).
///
/// The ends are paced (issue 42, finding 5): no 100 ms of hand-outs holds more than
/// `maxEndsPer100ms` = max(1, ⌈2 × S × 0.1 / (A / 2)⌉) of S streams, twice the even rate at which
/// S streams' limits fall over the A / 2 seconds they are drawn from; S counts the streams under
/// limits now and those ended by age in the last A / 2 seconds (so that a population whose
/// limits all fall in one window is paced as a whole, not ever more slowly as it thins). The
/// bound is kept over any `pacing` (200 ms) of hand-outs, not only 100 ms, so that the moments the
/// ends actually reach the clients, up to 100 ms after each hand-out on a busy machine, keep it
/// too; for S streams whose limits all fall in one window of A / 2 that is still their even rate
/// (rounded up). A
/// stream whose limit passed in a busier moment is handed out a little later, the oldest
/// deadline first. Once a drain begins (`stop()`) nothing more is handed out: the drain
/// ends every stream it will end.
///
/// Thread-safety: a `Sendable` value; mutate it under one lock.
public struct StreamAgeLimits: Sendable, Equatable {
    /// The configured limit A in seconds; 0 turns limits off.
    public let seconds: Int
    /// When each open stream reaches its limit, by subscriber id.
    public private(set) var deadlines: [UInt64: ContinuousClock.Instant] = [:]
    /// Whether a drain has begun (`stop()`): nothing is kept or handed out any more.
    public private(set) var isStopped = false
    /// When the hand-outs of the last A / 2 seconds were made, oldest first (one entry per
    /// stream), from `firstRecent` on (the entries before it are spent and dropped in bulk).
    private var recent: [ContinuousClock.Instant] = []
    private var firstRecent = 0

    /// Limits of `seconds` (0, or `range`'s 60 to 86,400).
    public init(seconds: Int) {
        self.seconds = seconds
    }

    /// What `--max-stream-age` accepts besides 0 (off), in seconds.
    public static let range = 60...86_400

    /// The span over which at most `maxEndsPer100ms` are handed out: 100 ms and a margin of 100 ms
    /// for the time each end takes to reach its client.
    public static let pacing = Duration.milliseconds(200)

    /// Whether streams have limits at all.
    public var isEnabled: Bool { seconds > 0 }

    /// The most streams ended by age in any 100 ms, with `streams` streams under limits of
    /// `seconds` (A): max(1, ⌈2 × S × 0.1 / (A / 2)⌉), as the drain's bound with the window A / 2
    /// over which a stream's limit falls (docs/operations.md, "Stream age").
    public static func maxEndsPer100ms(streams: Int, seconds: Int) -> Int {
        guard seconds > 0 else { return max(1, streams) }
        return max(1, Int((2 * Double(streams) * 0.1 / (Double(seconds) / 2)).rounded(.up)))
    }

    /// One stream's limit, uniform in [A/2, A] seconds.
    public func drawLimit(using generator: inout some RandomNumberGenerator) -> Duration {
        let limit = Double.random(in: Double(seconds) / 2...Double(seconds), using: &generator)
        return .milliseconds(Int64((limit * 1000).rounded()))
    }

    /// Stream `id` opened at `now` with `limit` (`drawLimit`). Nothing happens while limits are
    /// off, or once a drain has begun.
    public mutating func opened(_ id: UInt64, at now: ContinuousClock.Instant, limit: Duration) {
        guard isEnabled, !isStopped else { return }
        deadlines[id] = now + limit
    }

    /// Stream `id` is gone (for whatever reason): it is forgotten.
    public mutating func closed(_ id: UInt64) {
        deadlines.removeValue(forKey: id)
    }

    /// The streams to end by age at `now`, forgotten here; the caller ends them cleanly
    /// (`StreamEndReason.age`): those whose limit has come, oldest deadline first (then by id),
    /// as many as keep the last `pacing` of hand-outs within `maxEndsPer100ms` (S: the streams
    /// under limits now and those handed out in the last A / 2 seconds). Nothing once a drain has
    /// begun.
    public mutating func due(at now: ContinuousClock.Instant) -> [UInt64] {
        guard !isStopped, !deadlines.isEmpty else { return [] }
        // Hand-outs older than A / 2 no longer count towards S; older than `pacing`, not towards
        // the slice's ends.
        let window = Duration.milliseconds(seconds * 500)
        while firstRecent < recent.count, now - recent[firstRecent] >= window { firstRecent += 1 }
        if firstRecent > 1024, firstRecent * 2 > recent.count {
            recent.removeFirst(firstRecent)
            firstRecent = 0
        }
        var inSlice = 0
        for instant in recent[firstRecent...].reversed() {
            guard now - instant < Self.pacing else { break }
            inSlice += 1
        }
        let streams = deadlines.count + recent.count - firstRecent
        let room = Self.maxEndsPer100ms(streams: streams, seconds: seconds) - inSlice
        guard room > 0 else { return [] }
        let passed = deadlines.filter { $0.value <= now }
        guard !passed.isEmpty else { return [] }
        let due = passed.sorted { ($0.value, $0.key) < ($1.value, $1.key) }.prefix(room).map(\.key)
        for id in due { deadlines.removeValue(forKey: id) }
        recent += repeatElement(now, count: due.count)
        return due
    }

    /// A drain begins: no stream ends by age from now on (the drain ends them), and nothing is
    /// kept. Idempotent.
    public mutating func stop() {
        isStopped = true
        deadlines = [:]
        recent = []
        firstRecent = 0
    }
}

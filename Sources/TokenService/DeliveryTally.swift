import HTTPServing
import ServerSupport
import Synchronization

/// Events written to subscribers and events skipped by conflation.
public struct DeliveryCounts: Sendable, Equatable {
    /// Events started on a subscriber's connection.
    public var sent: UInt64
    /// Events a slow subscriber skipped because a newer one replaced them unsent.
    public var skipped: UInt64

    /// Counts of `sent` and `skipped` events.
    public init(sent: UInt64 = 0, skipped: UInt64 = 0) {
        self.sent = sent
        self.skipped = skipped
    }
}

/// The running totals of every subscriber's deliveries, past and present, served at `/metrics`
/// (`forge_push_token_events_sent_total`, `forge_push_token_events_skipped_total`).
///
/// Each `EventSubscriber` adds to it as it writes or skips an event, so a scrape reads two atomics
/// instead of visiting 10,000 subscribers under their locks.
///
/// Thread-safety: all members may be called from any thread (relaxed atomic counters: each total is
/// exact; the two are not read as one snapshot).
public final class DeliveryTally: Sendable {
    private let sent = Atomic<UInt64>(0)
    private let skipped = Atomic<UInt64>(0)

    /// Totals starting at zero.
    public init() {}

    /// The totals so far.
    public var counts: DeliveryCounts {
        DeliveryCounts(sent: sent.load(ordering: .relaxed), skipped: skipped.load(ordering: .relaxed))
    }

    func addSent() {
        sent.wrappingAdd(1, ordering: .relaxed)
    }

    func addSkipped() {
        skipped.wrappingAdd(1, ordering: .relaxed)
    }
}

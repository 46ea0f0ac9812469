/// One subscriber of the token's changes, as the owner sees it: a conflating mailbox with a way to
/// wake its reader.
///
/// The owner offers each new rendition, heartbeat and ending to the subscriber, outside its own
/// lock; a call that gives a waiting reader work returns `true`, and the owner then calls `wake()`,
/// after the call has returned. The subscriber keeps what must be kept per subscriber (its newest
/// unsent rendition); the owner keeps everything else. The HTTP layer's `EventSubscriber`
/// implements it for `GET /token/stream`.
///
/// Thread-safety: every member may be called from any thread.
public protocol TokenSubscriber<Rendition>: AnyObject, Sendable {
    /// What the subscriber receives.
    associatedtype Rendition: TokenRendition

    /// The subscriber's id within its owner, unique for the owner's lifetime.
    var id: UInt64 { get }

    /// Offers `rendition`; the subscriber keeps it only when its version is newer than the last
    /// one offered (so ids never repeat or go back), replacing an older unsent one.
    /// - Returns: `true` when the caller must call `wake()`.
    func offer(_ rendition: Rendition) -> Bool

    /// One heartbeat period has passed.
    /// - Returns: `true` when the caller must call `wake()`.
    func heartbeatTick() -> Bool

    /// Asks the subscription to end: `.finish` after what it holds (graceful shutdown), `.abort`
    /// at once (its client has gone, or shutdown's last step).
    /// - Returns: `true` when the caller must call `wake()`.
    func end(_ ending: SubscriberEnding) -> Bool

    /// Wakes the subscriber's reader (resumes its connection). Called only after a member above
    /// returned `true`, outside every lock of the owner.
    func wake()

    /// Events this subscriber sent and events it skipped (replaced unsent by a newer one).
    var deliveries: DeliveryCounts { get }
}

/// How a subscription ends.
public enum SubscriberEnding: Sendable, Equatable {
    /// Cleanly, after the event being written and any pending one: nothing is lost.
    case finish
    /// At once, without a clean end.
    case abort
}

/// Events delivered to subscribers and events skipped by conflation.
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

    /// The sum of two counts.
    public static func + (lhs: DeliveryCounts, rhs: DeliveryCounts) -> DeliveryCounts {
        DeliveryCounts(sent: lhs.sent &+ rhs.sent, skipped: lhs.skipped &+ rhs.skipped)
    }
}

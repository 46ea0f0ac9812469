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

    /// Asks the subscription to end: `.finish` after what it holds (a drain, an age limit,
    /// graceful shutdown), `.abort` at once (its client has gone, or shutdown's last step).
    /// `reason` is why, as the HTTP layer counts the end; the first reason given sticks when a
    /// subscription is asked to end more than once.
    /// - Returns: `true` when the caller must call `wake()`.
    func end(_ ending: SubscriberEnding, reason: StreamEndReason) -> Bool

    /// Wakes the subscriber's reader (resumes its connection). Called only after a member above
    /// returned `true`, outside every lock of the owner.
    func wake()

}

/// How a subscription ends.
public enum SubscriberEnding: Sendable, Equatable {
    /// Cleanly, after the event being written and any pending one: nothing is lost.
    case finish
    /// At once, without a clean end.
    case abort
}

/// Why an event stream ended, as the HTTP layer counts it (docs/operations.md, "Deploying and
/// upgrading").
public enum StreamEndReason: String, Sendable, CaseIterable, Equatable {
    /// The client went away (or its connection failed).
    case client
    /// A stopping replica ended it during its drain window (`--drain-seconds`).
    case drain
    /// It reached its own age limit (`--max-stream-age`).
    case age
    /// Graceful shutdown ended it (after the drain window, a second signal, or with no drain).
    case shutdown
    /// The bearer token it was opened with was revoked (taken out of the token files).
    case revoked
}

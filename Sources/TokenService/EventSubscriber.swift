import ForgePushToken
import ForgePushTokenOwner
import HTTPServing
import ServerSupport

/// One subscriber of `GET /token/stream`: a conflating, one-connection state machine between the
/// `TokenOwner` (any thread) and the engine's content reader (the engine's thread).
///
/// The subscriber holds at most one event it has not started to write (the newest: a subscriber
/// that falls behind skips to it, never to an older one; as its bytes, or as the first event's
/// snapshot until the reader renders it), the bytes of the event it is writing, a heartbeat flag
/// and how the stream should end. Its memory is bounded whatever the rate of changes.
///
/// The engine's reader calls `read(into:suspend:)`. With nothing to write it calls `suspend`
/// *under the subscriber's lock* and reports `.suspended`; every other transition that gives the
/// reader work (`offer`, `heartbeatTick`, `end`) returns `true` exactly once per suspension, and
/// the caller must then resume the connection, after the call has returned and the lock is
/// released. So a connection is resumed only while suspended, and exactly once.
///
/// Thread-safety: all members may be called from any thread.
public final class EventSubscriber: TokenSubscriber {
    /// How a stream ends: `.finish` terminates the chunked body after what is pending (shutdown),
    /// `.abort` closes the connection at once (the client has gone).
    public typealias Ending = SubscriberEnding

    /// What the reader should do after one `read(into:suspend:)` (`EventStreamRead`).
    public typealias ReadResult = EventStreamRead

    struct State {
        /// The newest event offered and not yet begun (`TokenSnapshot.event`): an array, so that an
        /// offer to each of tens of thousands of subscribers stores one reference, not a copy of
        /// the whole snapshot.
        var pending: [UInt8]?
        /// The first event's snapshot, until the reader renders it or a newer offer replaces it:
        /// kept whole because a subscriber is made under the owner's lock, and its first event
        /// rendered outside it.
        var first: TokenSnapshot?
        var lastOffered: UInt64?
        var output: [UInt8] = []
        var offset = 0
        var heartbeatDue = false
        var ending: Ending?
        var reason: StreamEndReason?
        var suspended = false

        mutating func takeResume() -> Bool {
            guard suspended else { return false }
            suspended = false
            return true
        }
    }

    /// The subscriber's id within its owner, unique for the owner's lifetime.
    public let id: UInt64
    /// The token that admitted the stream (shared with the token set: no copy), or `nil` when
    /// reads need none: a reload that removes it ends the stream (`Responder.replaceCredentials`).
    let credential: [UInt8]?
    private let state: Locked<State>
    private let resume: @Sendable () -> Void
    private let tally: DeliveryTally

    /// A subscriber whose first event is `first`; `wake` resumes its connection (see above); each
    /// event it writes or skips is added to `tally`. `preamble` is written before anything else (a
    /// `retry:` field); with a `floor` (a replica's subscriber whose `Last-Event-ID` is above
    /// `first`'s version), no event below `floor` is sent: the first event is the first offered at
    /// `floor` or above. `credential` is the token that admitted the stream (`nil`: none needed).
    public init(
        id: UInt64, first: TokenSnapshot, tally: DeliveryTally = DeliveryTally(), preamble: [UInt8] = [],
        floor: UInt64? = nil, credential: BearerAuthentication.Grant? = nil, wake: @escaping @Sendable () -> Void
    ) {
        self.id = id
        self.credential = credential?.token
        self.tally = tally
        var initial = State(pending: nil, first: first, lastOffered: first.version)
        initial.output = preamble
        if let floor, floor > first.version {
            initial.first = nil
            initial.lastOffered = floor - 1
        }
        self.state = Locked(initial)
        self.resume = wake
    }

    /// Resumes the subscriber's connection (the `wake` given at `init`).
    public func wake() {
        resume()
    }

    /// Offers `snapshot`; it replaces any unwritten older one, and is ignored when its version is
    /// not newer than the last one offered (so ids never repeat or go back).
    /// - Returns: `true` when the caller must resume the connection.
    public func offer(_ snapshot: TokenSnapshot) -> Bool {
        let event = snapshot.event  // outside the lock (a prepared snapshot's is made already)
        return state.withLock { state in
            if let last = state.lastOffered, snapshot.version <= last { return false }
            guard state.ending == nil else { return false }
            if state.pending != nil || state.first != nil { tally.addSkipped() }
            if state.first != nil { state.first = nil }  // only before the first event is read
            state.pending = event
            state.lastOffered = snapshot.version
            return state.takeResume()
        }
    }

    /// One heartbeat period has passed: asks for a `: keep-alive` comment unless an event is
    /// already waiting. So an idle stream carries something at least every period.
    /// - Returns: `true` when the caller must resume the connection.
    public func heartbeatTick() -> Bool {
        state.withLock { state in
            guard state.ending == nil, state.pending == nil, state.first == nil else { return false }
            state.heartbeatDue = true
            return state.takeResume()
        }
    }

    /// Asks the stream to end (`.abort` wins over `.finish`), for `reason` (the first reason
    /// given is kept: a stream a drain finished and whose client then left counts as `drain`).
    /// - Returns: `true` when the caller must resume the connection.
    public func end(_ ending: Ending, reason: StreamEndReason) -> Bool {
        state.withLock { state in
            if state.ending != .abort { state.ending = ending }
            if state.reason == nil { state.reason = reason }
            return state.takeResume()
        }
    }

    /// Why the stream was asked to end, or `nil` when it never was (then, once its connection is
    /// gone, its client went away: `StreamEndReason.client`).
    public var endReason: StreamEndReason? {
        state.withLock { $0.reason }
    }

    /// Whether the reader found nothing to write and suspended the connection, which now waits
    /// for a resume. Internal: the engine's tests wait on it for the suspension itself, rather
    /// than for a while, before they show that a departed subscriber is released while suspended.
    var isSuspended: Bool {
        state.withLock { $0.suspended }
    }

    /// Writes the next bytes of the stream into `buffer` (of any size; an event spans several calls
    /// when it must): the rest of the event being written, else the newest pending event, else a
    /// due heartbeat. With nothing to write, marks the subscriber
    /// suspended and calls `suspend` while holding its lock (the engine's suspend must happen
    /// before any publisher can see the flag), unless the stream is ending.
    public func read(into buffer: UnsafeMutableRawBufferPointer, suspend: () -> Void) -> ReadResult {
        state.withLock { state in
            if state.ending == .abort { return .abort }
            guard buffer.count > 0 else { return .bytes(0) }
            if state.offset == state.output.count {
                if let next = state.pending ?? state.first?.event {
                    state.output = next
                    state.pending = nil
                    state.first = nil
                    tally.addSent()
                    state.heartbeatDue = false
                } else if state.heartbeatDue, state.ending == nil {
                    state.output = ServerSentEvents.heartbeat
                    state.heartbeatDue = false
                } else if state.ending == .finish {
                    return .endOfStream
                } else {
                    state.suspended = true
                    suspend()
                    return .suspended
                }
                state.offset = 0
            }
            let count = min(buffer.count, state.output.count - state.offset)
            // `buffer` is not empty (checked above), so it has a base address; `output` has one
            // whenever `count` is above 0. An empty `output` (count 0) may have none, and then
            // there is nothing to copy: the guard leaves `offset` right in every case.
            state.output.withUnsafeBytes { source in
                guard let target = buffer.baseAddress, let start = source.baseAddress else { return }
                target.copyMemory(from: start + state.offset, byteCount: count)
            }
            state.offset += count
            return .bytes(count)
        }
    }
}

import ServerSupport

/// The deadline for one connection's request head and request body (`--header-timeout`, issue 21
/// §3), as a state machine that returns what to do: the engine keeps one per connection, tells it
/// what happened, and on each sweep asks it whether the connection is past its deadline.
///
/// libmicrohttpd's idle timeout (`MHD_OPTION_CONNECTION_TIMEOUT`) restarts on every byte received,
/// so a client that sends one header line every 2 s keeps a connection (and a slot of
/// `--max-connections`) for as long as it likes. nginx bounds the whole head instead
/// (`client_header_timeout`, `client_body_timeout`; answered `408`); so does this deadline:
///
/// - a new connection has `timeout` for its first request's head, from the moment it is accepted;
/// - a kept-alive connection between two requests has no deadline (the idle timeout applies) until
///   the engine sees bytes of the next request arrive (it looks every `lookInterval`); the head
///   then has `timeout` from that look, so at most `timeout + lookInterval` from its first byte;
/// - a request body has `timeout` from the end of its head;
/// - a request being answered, and an event stream once established, have none.
///
/// Past the deadline the engine answers `408` where it can (plain HTTP: nothing of an answer has
/// been sent yet) and closes its side for writing (`expire`); `linger` later, once the answer has
/// had time to reach the client, it closes the connection (`close`). A request whose head or body
/// completes after its deadline is not carried out (`headReceived`, `bodyReceived` answer false).
///
/// A value type with no clock of its own (every call takes the time): tested as plain values.
public struct RequestDeadline: Sendable, Equatable {
    /// Where the connection stands.
    public enum Phase: Sendable, Equatable {
        /// Receiving a request head since `mark`.
        case head
        /// Kept alive between two requests; the next look is at `mark`.
        case idle
        /// Receiving a request body since `mark`.
        case body
        /// Being answered, or an event stream: no deadline.
        case exempt
        /// Past its deadline: answered `408` (where possible) and closed for writing; closed for
        /// reading at `mark`.
        case expired
        /// Closed: nothing more to do.
        case closed
    }

    /// What the engine must do for the connection now.
    public enum Action: Sendable, Equatable {
        /// Nothing.
        case none
        /// The head (`body` false) or the body (`body` true) took longer than the timeout: answer
        /// `408` where possible, close the write side, and count it.
        case expire(body: Bool)
        /// Close the read side, which makes libmicrohttpd close the connection.
        case close
    }

    /// How long after the `408` the connection is closed.
    public static let linger: Duration = .seconds(1)
    /// How often a kept-alive connection between two requests is looked at for bytes of the next.
    public static let lookInterval: Duration = .seconds(1)
    /// How long after an answer bytes must arrive to count as the next request's. The engine asks
    /// the kernel (`TCP_INFO`'s `tcpi_last_data_recv`), which counts in scheduler ticks (1 to
    /// 10 ms) and rounds down: the previous request's own last bytes, received microseconds
    /// before its answer, could read as arriving after it, and an idle kept-alive connection got a
    /// `408` (attack finding). A next request that starts within this slack and then stalls is
    /// left to the idle timeout.
    public static let receiveClockSlack: Duration = .milliseconds(100)
    /// The default timeout, in seconds (`--header-timeout`).
    public static let defaultSeconds = 10

    /// Where the connection stands.
    public private(set) var phase: Phase
    /// The instant the current phase is measured from (see `Phase`).
    public private(set) var mark: ContinuousClock.Instant

    /// A connection accepted at `now`: its first request's head is due within the timeout.
    public init(connectedAt now: ContinuousClock.Instant) {
        phase = .head
        mark = now
    }

    /// The head has arrived (the first access-handler call) at `now`; a body follows when
    /// `bodyExpected`. Returns false when the connection is past its deadline: the request must not
    /// be carried out.
    public mutating func headReceived(at now: ContinuousClock.Instant, bodyExpected: Bool) -> Bool {
        guard phase != .expired && phase != .closed else { return false }
        phase = bodyExpected ? .body : .exempt
        mark = now
        return true
    }

    /// The body is complete (the access handler's last call before the answer). Returns false
    /// when the connection is past its deadline: the request must not be carried out.
    public mutating func bodyReceived() -> Bool {
        guard phase != .expired && phase != .closed else { return false }
        phase = .exempt
        return true
    }

    /// The request was answered at `now` and the connection is kept alive.
    public mutating func completed(at now: ContinuousClock.Instant) {
        guard phase != .expired && phase != .closed else { return }
        phase = .idle
        mark = now + Self.lookInterval
    }

    /// What to do at `now` with a deadline of `timeout`. `receivedSince` is asked, only for a
    /// kept-alive connection due for a look, whether bytes have arrived since the given instant
    /// (the answer, or the previous look, plus `receiveClockSlack`).
    public mutating func check(
        at now: ContinuousClock.Instant, timeout: Duration,
        receivedSince: (ContinuousClock.Instant) -> Bool
    ) -> Action {
        switch phase {
        case .head, .body:
            guard now - mark >= timeout else { return .none }
            let body = phase == .body
            phase = .expired
            mark = now + Self.linger
            return .expire(body: body)
        case .idle:
            guard now >= mark else { return .none }
            if receivedSince(mark - Self.lookInterval + Self.receiveClockSlack) {
                phase = .head
                mark = now
            } else {
                mark = now + Self.lookInterval
            }
            return .none
        case .expired:
            guard now >= mark else { return .none }
            phase = .closed
            return .close
        case .exempt, .closed:
            return .none
        }
    }
}

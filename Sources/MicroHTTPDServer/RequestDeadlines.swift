import CMicroHTTPD
import ForgePushToken
import HTTPServing
import ServerSupport

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// The `RequestDeadline` of every open connection of one daemon (`--header-timeout`), and the
/// sweep that enforces them: libmicrohttpd's own idle timeout restarts on every byte, so it cannot
/// bound a request head that arrives a line every few seconds. Also notes whether requests
/// advanced during a daemon run (`takeProgress`).
///
/// Thread-safety: the methods are called on the daemon's own loop thread (libmicrohttpd's
/// callbacks and the loop's tick run there), so the lock is uncontended, except at shutdown, when
/// `MHD_stop_daemon` reports the last closes on the stopping thread after the loop has ended; the
/// one lock makes either safe. Side effects on sockets happen after it is released
/// (`MicroHTTPDServer.enforce`).
final class ConnectionDeadlines: Sendable {
    /// One connection's deadline, in a box of its own made when the connection is accepted, so
    /// that a request's events change it in place: a `Dictionary`'s in-place mutation
    /// (`entries[key]?.field = …`) runs its `_modify` coroutines, whose frames are allocated on the
    /// heap, some 16 allocations a request on the cached read's path. The connection's socket
    /// context (`MHD_CONNECTION_INFO_SOCKET_CONTEXT`) holds it too, from its acceptance to its close
    /// (`connected`, `closed`), so that a request's events find it without hashing the connection:
    /// three dictionary lookups a request, about 450 instructions, were a tenth of ours on
    /// `POST /register`.
    ///
    /// `@unchecked Sendable` is sound because every access to its fields is made under
    /// `ConnectionDeadlines`' lock (outside it the box is only an opaque word, or an `Unmanaged`
    /// handed back to it), which also makes its variables' run-time exclusivity check redundant
    /// (`@exclusivity(unchecked)`, SE-0176): no two accesses can overlap, and none calls out while
    /// it lasts.
    final class Entry: @unchecked Sendable {
        @exclusivity(unchecked) var deadline: RequestDeadline
        let fd: Int32
        /// The `Origin` of the request whose body is arriving (kept only while CORS is on), for
        /// the CORS fields of its 408.
        @exclusivity(unchecked) var origin: String?
        /// Whether the sweep sees it: not while its connection carries an event stream
        /// (`forget`), again once that stream's request is over (`completed`).
        @exclusivity(unchecked) var swept = true

        init(deadline: RequestDeadline, fd: Int32) {
            self.deadline = deadline
            self.fd = fd
        }

        /// Its request is over: the deadline moves on, and the next request's `Origin` is not
        /// known yet.
        func completed(at now: ContinuousClock.Instant) {
            deadline.completed(at: now)
            origin = nil
        }
    }

    private struct State: Sendable {
        /// By connection pointer (its bit pattern): inserted when a connection is accepted,
        /// removed when it closes or opens an event stream (`forget`); the sweep (`due`) walks
        /// them. A request's events reach a box through its socket context instead.
        var entries: [UInt: Entry] = [:]
        /// Whether a request began or ended since `takeProgress()` last looked.
        var progressed = false
    }

    private let state = Locked(State())

    /// Whether a request's head arrived or a request ended since the last call: the daemon run
    /// made progress, so the loop must not back off (DaemonLoop). Pipelined requests that are
    /// already buffered make libmicrohttpd ask for another run at once without any socket event,
    /// as does a connection it cannot advance; only the first is progress.
    func takeProgress() -> Bool {
        state.withLock { state in
            defer { state.progressed = false }
            return state.progressed
        }
    }

    /// How many connections the sweep (`due`) looks at: every open one but those carrying an
    /// event stream.
    var sweptConnections: Int {
        state.withLock { $0.entries.count }
    }

    /// A connection was accepted (`MHD_CONNECTION_NOTIFY_STARTED`).
    /// - Returns: the word to store as its socket context (never `nil`): its deadline's box,
    ///   retained until `closed(_:context:)` is given it back.
    func connected(_ connection: OpaquePointer, at now: ContinuousClock.Instant) -> UnsafeMutableRawPointer {
        register(UInt(bitPattern: connection), fd: fpt_connection_fd(connection), at: now)
    }

    /// `connected(_:at:)` for the connection whose pointer's bit pattern is `key` and whose socket
    /// is `fd` (apart, so that a test can hold a box's life to account without libmicrohttpd).
    func register(_ key: UInt, fd: Int32, at now: ContinuousClock.Instant) -> UnsafeMutableRawPointer {
        let entry = Entry(deadline: RequestDeadline(connectedAt: now), fd: fd)
        state.withLock { $0.entries[key] = entry }
        return Unmanaged.passRetained(entry).toOpaque()
    }

    /// A connection was closed (`MHD_CONNECTION_NOTIFY_CLOSED`); `context` is what `connected`
    /// returned for it (released here).
    func closed(_ connection: OpaquePointer, context: UnsafeMutableRawPointer) {
        unregister(UInt(bitPattern: connection), context: context)
    }

    /// `closed(_:context:)` by key (`register`).
    func unregister(_ key: UInt, context: UnsafeMutableRawPointer) {
        state.withLock { _ = $0.entries.removeValue(forKey: key) }
        Unmanaged<Entry>.fromOpaque(context).release()
    }

    /// The box of `connection`'s deadline, from its socket context (`nil` for a connection that
    /// `connected` was not told of, which libmicrohttpd does not make). Unmanaged: the socket
    /// context keeps it alive, and a reference taken here would be retained and released.
    private func entry(of connection: OpaquePointer) -> Unmanaged<Entry>? {
        fpt_socket_context(connection).map { Unmanaged<Entry>.fromOpaque($0) }
    }

    /// An event stream was opened on `connection`: it has no deadline while the stream lasts.
    func forget(_ connection: OpaquePointer) {
        forget(UInt(bitPattern: connection))
    }

    /// `forget(_:)` by key (`register`): the box stays alive, held by the socket context, and goes
    /// back to the sweep when the stream's request is over (`completed`).
    func forget(_ key: UInt) {
        state.withLock { state in
            state.entries.removeValue(forKey: key)?.swept = false
        }
    }

    /// A request's head has arrived, from `origin` (its `Origin`, `nil` while CORS is off); false
    /// when its connection is past its deadline (the request must not be carried out). See
    /// `RequestDeadline.headReceived`.
    func headReceived(
        _ connection: OpaquePointer, at now: ContinuousClock.Instant, bodyExpected: Bool, origin: String?
    ) -> Bool {
        let entry = entry(of: connection)
        return state.withLock { state in
            state.progressed = true
            guard let entry = entry?.takeUnretainedValue() else { return true }
            if origin != nil { entry.origin = origin }
            return entry.deadline.headReceived(at: now, bodyExpected: bodyExpected)
        }
    }

    /// A request's body is complete; false when its connection is past its deadline.
    func bodyReceived(_ connection: OpaquePointer) -> Bool {
        let entry = entry(of: connection)
        return state.withLock { _ in entry?.takeUnretainedValue().deadline.bodyReceived() ?? true }
    }

    /// A request on `connection` is over (it may stay open for the next). After an event stream
    /// that ended cleanly the connection is kept alive like any other, so its box goes back to
    /// the sweep: the next request's head is bound by `--header-timeout` again.
    func completed(_ connection: OpaquePointer, at now: ContinuousClock.Instant) {
        guard let entry = entry(of: connection) else {
            state.withLock { $0.progressed = true }
            return
        }
        completed(UInt(bitPattern: connection), entry: entry, at: now)
    }

    /// `completed(_:at:)` by key (`register`), with the box.
    func completed(_ key: UInt, entry: Unmanaged<Entry>, at now: ContinuousClock.Instant) {
        state.withLock { state in
            state.progressed = true
            let entry = entry.takeUnretainedValue()
            entry.completed(at: now)
            if !entry.swept {
                entry.swept = true
                state.entries[key] = entry
            }
        }
    }

    /// The connections that must be expired or closed at `now` with a deadline of `timeout`, as
    /// (socket, action, the request's `Origin` when known) triples, for the caller to act on after
    /// the lock is released. Looking at a kept-alive connection's socket (`TCP_INFO`) changes
    /// nothing, so it is done under the lock.
    func due(at now: ContinuousClock.Instant, timeout: Duration) -> [(
        fd: Int32, action: RequestDeadline.Action, origin: String?
    )] {
        state.withLock { state in
            var due: [(fd: Int32, action: RequestDeadline.Action, origin: String?)] = []
            for entry in state.entries.values {
                let fd = entry.fd
                let action = entry.deadline.check(at: now, timeout: timeout) { since in
                    guard let silent = millisecondsSinceDataReceived(fd) else { return false }
                    return .milliseconds(silent) < now - since
                }
                if action != .none { due.append((fd, action, entry.origin)) }
            }
            return due
        }
    }
}

extension MicroHTTPDServer {
    /// Enforces `deadlines` at `now` (the loop's tick): a connection past `--header-timeout` is
    /// answered `408` (with the CORS fields for the request's `Origin` when its head had arrived)
    /// when it is plain HTTP (nothing of an answer has been sent while a request is
    /// still arriving, so the bytes cannot interleave with libmicrohttpd's; over TLS they cannot be
    /// written beside GnuTLS) and closed for writing, having been counted and logged at debug
    /// level first (so a client that saw the answer finds it counted); a second
    /// later it is closed for reading, which libmicrohttpd takes as the client's departure and
    /// closes the connection.
    func enforce(_ deadlines: ConnectionDeadlines, at now: ContinuousClock.Instant) {
        let seconds = configuration.headerTimeoutSeconds
        for (fd, action, origin) in deadlines.due(at: now, timeout: .seconds(seconds)) where fd >= 0 {
            switch action {
            case .expire(let body):
                // Counted and logged before the client can see the answer or the close.
                application.record(.requestTimedOut(body: body))
                log.log(.debug, "closing a connection whose request \(body ? "body" : "head") took over \(seconds) s")
                if configuration.tls == nil {
                    let message = EngineAnswers.requestTimeout(seconds: seconds, body: body)
                        .closingMessage(
                            reason: "Request Timeout", date: httpDate(), crossOrigin: traits.crossOrigin,
                            origin: origin)
                    _ = message.withUnsafeBytes {
                        send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT))
                    }
                }
                closeSide(of: fd, Int32(SHUT_WR))
            case .close:
                closeSide(of: fd, Int32(SHUT_RD))
            case .none:
                break
            }
        }
    }
}

/// Milliseconds since the socket last received data (`TCP_INFO`'s `tcpi_last_data_recv`, Linux
/// tcp(7)), or `nil` when it cannot be read: whether a kept-alive connection between two requests
/// has begun sending the next (libmicrohttpd keeps what it has read to itself).
private func millisecondsSinceDataReceived(_ fd: Int32) -> Int? {
    var info = tcp_info()
    var length = socklen_t(MemoryLayout<tcp_info>.size)
    guard getsockopt(fd, Int32(IPPROTO_TCP), Int32(TCP_INFO), &info, &length) == 0 else { return nil }
    return Int(info.tcpi_last_data_recv)
}

/// `shutdown(2)` of one side of a socket (a free function: `MicroHTTPDServer.shutdown()` hides
/// the C one inside the class).
private func closeSide(of fd: Int32, _ how: Int32) {
    _ = shutdown(fd, how)
}

/// The current time as an IMF-fixdate (RFC 9110 §5.6.7), for a `Date` field.
func httpDate() -> String {
    var now = time(nil)
    var parts = tm()
    gmtime_r(&now, &parts)
    var buffer = [CChar](repeating: 0, count: 40)
    let count = strftime(&buffer, buffer.count, "%a, %d %b %Y %H:%M:%S GMT", &parts)
    return String(decoding: buffer[..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

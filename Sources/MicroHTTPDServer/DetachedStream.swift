import CLinuxEvents
import CMicroHTTPD
import ForgePushToken
import HTTPServing
import ServerSupport
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

// Detached event streams (issue 44; docs/architecture.md, "Detached streams"): once admission has
// decided 200 for a `GET /token/stream` over HTTP/1.1 on plain HTTP, the engine takes a copy of
// the connection's socket (`F_DUPFD_CLOEXEC`), returns `MHD_NO`, and writes the stream itself from
// its daemon's loop. libmicrohttpd then frees the connection's pool and forgets it (with
// `MHD_USE_TURBO`, without a half-close: `MicroHTTPDServer.start()`), so an idle subscriber costs
// the engine a `DetachedStream` and its source instead of a pool.

/// One detached event stream: its socket (the engine's copy), the application's source, where it
/// stands (`DetachedStreamState`) and what its record needs.
///
/// Made on the thread of the daemon that handed its connection over, and passed once to the loop
/// that serves it (`DetachedStreams.adopt(_:)`, which may be another daemon's: the least loaded).
///
/// `@unchecked Sendable` is sound because it crosses threads only that once, through the serving
/// loop's `incoming` list behind its lock (the maker never touches it after `adopt`); from then
/// on only that loop's thread touches it, and `MicroHTTPDServer.stop()` after that loop has ended.
final class DetachedStream: @unchecked Sendable {
    /// Its key in `DetachedStreams` (the engine's own, unique per daemon).
    let key: UInt64
    /// The engine's copy of the socket.
    let fd: Int32
    /// The application's source (`HTTPEventSource`).
    let source: any HTTPEventSource
    /// What its record (`FinishedRequest`) needs of the request's context, copied: the context
    /// itself (a few hundred bytes) is released with libmicrohttpd's part of the request.
    let method: String
    let path: String
    let status: Int
    let started: ContinuousClock.Instant
    /// Records the finished stream with the label the application gave it
    /// (`HTTPApplication.recordFinished(_:label:)`): a closure, because the label's type is the
    /// application's and this class, kept by the non-generic `DetachedStreams`, is not generic.
    let record: (FinishedRequest) -> Void
    /// Its client's address: the place it holds in the `ConnectionLimiter`.
    let client: ClientAddress?
    /// Its peer's address as text, when the application records addresses.
    let remote: String?
    /// Where it stands.
    var state: DetachedStreamState
    /// The source's bytes sent so far (without the chunk framing), for the record.
    var bytesWritten = 0
    /// Since when the client has not taken what it was sent (`nil`: it has).
    var stalledSince: ContinuousClock.Instant?

    init(
        key: UInt64, fd: Int32, source: any HTTPEventSource, context: RequestContext, client: ClientAddress?,
        remote: String?, head: [UInt8], record: @escaping (FinishedRequest) -> Void
    ) {
        self.key = key
        self.fd = fd
        self.source = source
        self.method = context.method
        self.path = context.path
        self.status = context.status
        self.started = context.started
        self.record = record
        self.client = client
        self.remote = remote
        self.state = DetachedStreamState(head: head)
    }
}

/// The detached streams one daemon loop serves, and the loop work that writes them: streams
/// adopted (from any daemon's thread), woken sources (from any thread) and sockets that became
/// writable (its own epoll set, which the `DaemonLoop` polls beside the daemon's).
///
/// A stream is served by the loop with the fewest streams when it is handed over
/// (`Daemon.openDetachedStream`), not by the daemon that accepted it: the daemons share one
/// listening socket, and whichever loop wakes first accepts, so the accepting split is uneven (56
/// to 44 % of 10,000 subscribers over two loops in one run), and a publish's last event waits
/// for the busiest loop.
///
/// `@unchecked Sendable` is sound because only `adopt(_:)`, `wake(_:)`, `newKey()` and `load`
/// are called from other threads, and they touch only `incoming` and `woken` (behind their
/// locks), `hasWoken`, `nextKey` and `adopted` (atomics);
/// every other member runs on the daemon's loop thread, or in `MicroHTTPDServer.stop()` after that
/// thread has ended (`DaemonLoop.stop()` waits for it), so the stored dictionaries are never
/// shared.
final class DetachedStreams: @unchecked Sendable {
    /// The epoll set of the streams' sockets, for `EPOLLOUT` (edge-triggered): polled by the loop.
    let epoll: Int32
    private let loop: DaemonLoop
    /// `ServerConfiguration.clock`: when a stream began to stall.
    private let clock: ServerClock
    /// What the server does when a stream ends (`MicroHTTPDServer.detachedStreamEnded`), before
    /// its socket is closed.
    private let ended: (DetachedStream) -> Void
    private let woken = Locked<[UInt64]>([])
    /// Streams handed over to this loop and not yet taken in (`adopt(_:)`).
    private let incoming = Locked<[DetachedStream]>([])
    /// Whether `woken` or `incoming` may hold something: set after each append, so that the
    /// loop's turn after a daemon run with nothing woken (every ordinary request) costs one atomic
    /// load, not a lock.
    private let hasWoken = Atomic<Bool>(false)
    private let nextKey = Atomic<UInt64>(1)
    /// Streams adopted and not yet ended: what the hand-over balances on.
    private let adopted = Atomic<Int>(0)
    private var spare: [UInt64] = []
    private var streams: [UInt64: DetachedStream] = [:]
    private var stalled: Set<UInt64> = []
    /// The libmicrohttpd connections handed over and not yet reported closed: their place in the
    /// `ConnectionLimiter` passed to the stream (`mhdConnectionNotify`).
    private var handedOver: Set<OpaquePointer> = []
    /// The loop's buffer: each read of a source is framed and sent from here, so that a stream
    /// keeps no buffer of its own unless the kernel refuses part of a send.
    private let scratch: UnsafeMutableRawBufferPointer
    private var events = [epoll_event](repeating: epoll_event(), count: 256)

    /// Bytes of the loop's buffer (the most one send carries).
    static let scratchBytes = 16 * 1024
    /// The most steps one stream takes per turn before the others get theirs.
    static let stepsPerTurn = 64
    /// The send buffer asked for each detached socket (`SO_SNDBUF`; Linux doubles it, socket(7)).
    ///
    /// Without it the kernel grows a stream's send buffer toward `tcp_wmem`'s maximum (4 MiB here)
    /// as long as its client acknowledges, and a client that reads nothing still acknowledges
    /// until its receive window is full: every send then succeeds, the stream never waits, and the
    /// stall limit (`closeStalled`) never starts counting while events keep coming, while the
    /// kernel holds up to 4 MiB for it. With 16 KiB asked (32 KiB given), a client that takes
    /// nothing stalls once that and its own receive window are full, and is closed 120 s later.
    /// An event is a few hundred bytes: a reading client never comes near it.
    static let sendBufferBytes = 16 * 1024

    /// - Throws: `ServerError.socket` when the epoll set cannot be made.
    init(loop: DaemonLoop, clock: ServerClock, ended: @escaping (DetachedStream) -> Void) throws(ServerError) {
        epoll = epoll_create1(Int32(EPOLL_CLOEXEC))
        guard epoll >= 0 else { throw .socket(call: "epoll_create1", address: "detached streams", errno: errno) }
        self.loop = loop
        self.clock = clock
        self.ended = ended
        scratch = .allocate(byteCount: Self.scratchBytes, alignment: 16)
    }

    deinit {
        scratch.deallocate()
        close(epoll)
    }

    /// The number of streams open (loop thread, or after the loop ended).
    var count: Int { streams.count }

    /// The streams adopted and not yet ended (any thread; a relaxed reading).
    var load: Int { adopted.load(ordering: .relaxed) }

    /// A key for a stream about to be opened (any thread).
    func newKey() -> UInt64 {
        nextKey.wrappingAdd(1, ordering: .relaxed).oldValue
    }

    /// The source of stream `key` asks to be read again (any thread; its `wake`): the loop reads
    /// it after its current turn.
    ///
    /// The loop is woken at once, not when a `WakeBatch` in progress ends: a publish offers every
    /// subscriber on the publishing thread, and the other loops send to theirs meanwhile (their
    /// streams are not libmicrohttpd's, so an early wake costs them no walk of its suspended
    /// list; `DaemonLoop.wake()` coalesces the wake-ups to one per daemon run).
    func wake(_ key: UInt64) {
        woken.withLock { $0.append(key) }
        // Read before written: a publish wakes every stream of this loop in a row. Seen false
        // whenever the loop's turn has taken the flag after this key's append could be in its
        // swap (that exchange comes before the swap's lock, which this append's lock follows).
        if !hasWoken.load(ordering: .acquiring) { hasWoken.store(true, ordering: .releasing) }
        loop.wake()
    }

    /// Takes `stream` over (any thread: the thread of the daemon that handed its connection over):
    /// the loop takes it in and sends its head on its next turn.
    func adopt(_ stream: DetachedStream) {
        adopted.add(1, ordering: .relaxed)
        incoming.withLock { $0.append(stream) }
        hasWoken.store(true, ordering: .releasing)
        if !WakeBatch.wakeLater(loop) { loop.wake() }
    }

    /// Notes that this daemon handed `connection` over (this daemon's loop thread): its place in
    /// the limiter is the stream's now (`releaseHandOver(_:)`).
    func noteHandOver(_ connection: OpaquePointer) {
        handedOver.insert(connection)
    }

    /// Takes in the streams adopted since the last turn (loop thread, or after the loop ended):
    /// registers each socket for `EPOLLOUT` and sends what it can of each head.
    private func takeIncoming() {
        let arrived = incoming.withLock { list in
            defer { list.removeAll() }
            return list
        }
        for stream in arrived {
            streams[stream.key] = stream
            var size = Int32(Self.sendBufferBytes)
            setsockopt(stream.fd, SOL_SOCKET, SO_SNDBUF, &size, socklen_t(MemoryLayout<Int32>.size))
            var event = epoll_event(
                events: EPOLLOUT.rawValue | EPOLLET.rawValue, data: epoll_data_t(u64: stream.key))
            epoll_ctl(epoll, EPOLL_CTL_ADD, stream.fd, &event)
            stream.state.woken()
            pump(stream)
        }
    }

    /// Whether `connection` was handed over (and forgets it): libmicrohttpd reports it closed,
    /// but its place in the limiter is the stream's now.
    func releaseHandOver(_ connection: OpaquePointer) -> Bool {
        handedOver.remove(connection) != nil
    }

    /// The loop's turn (after each daemon run): the sockets that became writable (`writable`:
    /// the epoll set is readable), then the streams adopted, then the woken sources.
    func serve(writable: Bool) {
        if writable {
            while true {
                let count = epoll_wait(epoll, &events, Int32(events.count), 0)
                guard count > 0 else { break }
                for event in events.prefix(Int(count)) {
                    guard let stream = streams[event.data.u64] else { continue }
                    stream.state.writable()
                    pump(stream)
                }
                if count < Int32(events.count) { break }
            }
        }
        // A key appended after the exchange sets the flag again after its append: seen next turn.
        guard hasWoken.load(ordering: .acquiring), hasWoken.exchange(false, ordering: .acquiringAndReleasing)
        else { return }
        takeIncoming()
        woken.withLock { swap(&$0, &spare) }
        guard !spare.isEmpty else { return }
        for key in spare {
            guard let stream = streams[key] else { continue }
            stream.state.woken()
            pump(stream)
        }
        spare.removeAll(keepingCapacity: true)
    }

    /// Closes the streams whose client has not taken what it was sent for `limit` (loop thread,
    /// from its tick).
    func closeStalled(at now: ContinuousClock.Instant, limit: Duration) {
        guard !stalled.isEmpty else { return }
        for key in stalled {
            guard let stream = streams[key], let since = stream.stalledSince, now - since >= limit else { continue }
            stream.state.abort()
            pump(stream)
        }
    }

    /// Closes every stream left, without a clean end (`MicroHTTPDServer.stop()`, after the loop
    /// has ended: the grace period is over, and these clients did not take their last chunk).
    /// - Returns: how many were closed.
    func closeAll() -> Int {
        takeIncoming()
        let left = Array(streams.values)
        for stream in left {
            stream.state.abort()
            pump(stream)
        }
        return left.count
    }

    /// Carries out the stream's steps until it waits or closes (at most `stepsPerTurn`; then it
    /// is woken again, after the others).
    private func pump(_ stream: DetachedStream) {
        for _ in 0..<Self.stepsPerTurn {
            switch stream.state.next() {
            case .none:
                return
            case .wait:
                noteStall(stream)
                return
            case .close(let clean):
                finish(stream, clean: clean)
                return
            case .sendBacklog:
                let sent = stream.state.backlog.withUnsafeBytes { bytes in
                    send(
                        stream.fd, bytes.baseAddress! + stream.state.offset, bytes.count - stream.state.offset,
                        sendFlags)
                }
                if sent < 0, !isTransient(errno) { stream.state.failed() } else { stream.state.sentBacklog(sent) }
            case .read:
                read(stream)
            }
        }
        wake(stream.key)
    }

    /// One read of the stream's source into the loop's buffer (as much as the buffer takes, in
    /// several calls when an event and what follows it are split), framed as one chunk and sent.
    private func read(_ stream: DetachedStream) {
        let capacity = scratch.count - ChunkFraming.prefixRoom - ChunkFraming.suffixRoom
        var filled = 0
        var result = EventStreamRead.bytes(0)
        while filled < capacity {
            let room = UnsafeMutableRawBufferPointer(
                rebasing: scratch[(ChunkFraming.prefixRoom + filled)..<(ChunkFraming.prefixRoom + capacity)])
            result = stream.source.read(into: room, suspend: {})
            guard case .bytes(let count) = result, count > 0 else { break }
            filled += count
        }
        let framed = ChunkFraming.frame(scratch, count: filled, last: result == .endOfStream)
        let total = stream.state.read(result, framedCount: framed.count)
        guard total > 0 else { return }
        stream.bytesWritten += filled
        let sent = send(stream.fd, scratch.baseAddress! + framed.start, total, sendFlags)
        if sent < 0, !isTransient(errno) {
            stream.state.failed()
            return
        }
        let scratch = self.scratch
        stream.state.sentFresh(sent, of: total) { taken in
            Array(scratch[(framed.start + taken)..<(framed.start + total)])
        }
    }

    private func noteStall(_ stream: DetachedStream) {
        if stream.state.isStalled {
            if stream.stalledSince == nil {
                stream.stalledSince = clock.now
                stalled.insert(stream.key)
            }
        } else if stream.stalledSince != nil {
            stream.stalledSince = nil
            stalled.remove(stream.key)
        }
    }

    /// Ends the stream: the server's records first, then the socket closed (after its last chunk
    /// when `clean`, and after dropping what the client sent behind its request: see
    /// `dropReceived`).
    private func finish(_ stream: DetachedStream, clean: Bool) {
        streams[stream.key] = nil
        stalled.remove(stream.key)
        ended(stream)
        epoll_ctl(epoll, EPOLL_CTL_DEL, stream.fd, nil)
        if clean { dropReceived(stream.fd) }
        close(stream.fd)
        stream.state.closed()
        adopted.subtract(1, ordering: .relaxed)
    }

    /// Reads and drops, without waiting, up to `scratchBytes` * `drainReads` bytes the client sent
    /// after the stream's request: a request pipelined behind it, which the stream's
    /// `Connection: close` leaves unanswered (docs/http-api.md). A socket closed with unread bytes
    /// sends a reset instead of a FIN, and a client that gets the reset may drop the stream's last
    /// chunk unread (RFC 9112 §9.6). One `recv` that finds nothing when the client sent nothing.
    private func dropReceived(_ fd: Int32) {
        for _ in 0..<Self.drainReads {
            let count = recv(fd, scratch.baseAddress, scratch.count, Int32(MSG_DONTWAIT))
            if count < scratch.count { return }
        }
    }

    /// The most reads of `dropReceived`: 64 KiB dropped at most, so that a client that keeps
    /// sending cannot hold the loop.
    static let drainReads = 4
}

/// `send(2)`'s flags for detached streams: never blocks, never raises `SIGPIPE`.
private let sendFlags = Int32(MSG_NOSIGNAL | MSG_DONTWAIT)

/// Whether a failed send may succeed later (the socket's buffer is full, or a signal came).
private func isTransient(_ code: Int32) -> Bool {
    code == EAGAIN || code == EWOULDBLOCK || code == EINTR
}

/// Copies `fd` for a detached stream, close-on-exec (`F_DUPFD_CLOEXEC`): the copy, or -1 with
/// `errno` (`EMFILE` when the process has no descriptor left). `MicroHTTPDServer.copySocket`.
@Sendable func copyDescriptor(_ fd: Int32) -> Int32 { fcntl(fd, F_DUPFD_CLOEXEC, 0) }

extension Daemon {
    /// Whether the stream `context` asks for is handed over (detached): plain HTTP, `GET`,
    /// HTTP/1.1, and the server allows it (`ServerConfiguration.detachesStreams`).
    func detaches(_ context: RequestContext, version: UnsafePointer<CChar>?) -> Bool {
        server.detachesStreams && context.method == "GET" && version.map { strcmp($0, "HTTP/1.1") == 0 } == true
    }

    /// Opens the event stream the admitted request of `context` asked for and hands its connection
    /// over: the engine's copy of the socket goes to `detached`, and `MHD_NO` ends libmicrohttpd's
    /// part. A refusal is answered by libmicrohttpd as before; a copy that cannot be made (no
    /// descriptor left) gets `503 too_many_subscribers`.
    func openDetachedStream(_ context: Admitted, on connection: OpaquePointer) -> MHD_Result {
        // The loop with the fewest streams serves it (`DetachedStreams`: the accepting split is uneven).
        let streams = detachedLoops.min { $0.load < $1.load } ?? detached
        let key = streams.newKey()
        let (head, source) = application.openStream(for: context.admitted, wake: { streams.wake(key) })
        guard let source else { return respond(head, on: connection, context: context) }
        let fd = fpt_connection_fd(connection)
        let copy = fd >= 0 ? copySocket(fd) : -1
        guard copy >= 0 else {
            source.close()
            let error = ServiceError(
                "too_many_subscribers", "the service has no file descriptor left for another subscriber; retry later")
            return respond(
                .error(503, error, headers: ["Retry-After": String(handOverRetryAfterSeconds)]), on: connection,
                context: context)
        }
        context.machine.sent()
        context.status = head.status
        context.detached = true
        let stream = DetachedStream(
            key: key, fd: copy, source: source, context: context,
            client: fpt_connection_address(connection).flatMap(ClientAddress.init),
            remote: traits.wantsPeerAddresses ? peerAddress(of: connection) : nil,
            head: detachedStreamHead(head, context: context),
            record: { [application, label = context.label] in application.recordFinished($0, label: label) })
        server.openStreams.withLock { $0 += 1 }
        deadlines.forget(connection)
        server.watcher.watch(fd: copy, id: source.id)
        detached.noteHandOver(connection)
        streams.adopt(stream)
        logBox.expectHandOverLine()
        return .NO
    }
}

/// The `Retry-After` seconds of the `503` for a stream whose socket could not be copied.
let handOverRetryAfterSeconds = 5

/// The head the engine writes for a detached stream: the status line, `head`'s fields completed as
/// every answer's are (`ResponseHeaders.completing`), `Date`, `Connection: close` (the engine
/// closes the connection after the stream's clean end) and `Transfer-Encoding: chunked`.
func detachedStreamHead(_ head: HTTPResponse, context: RequestContext) -> [UInt8] {
    // A source comes with a 200 (HTTPApplication.openStream); a reason phrase is not read by
    // clients (RFC 9112 §4), so any other status gets a neutral one.
    let reason = head.status == 200 ? "OK" : "Stream"
    var text = "HTTP/1.1 \(head.status) \(reason)\r\n"
    for field in ResponseHeaders.completing(head.headers, crossOrigin: context.crossOrigin, origin: context.origin) {
        text += "\(field.name): \(field.value)\r\n"
    }
    text += "Date: \(httpDate())\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n"
    return Array(text.utf8)
}

extension MicroHTTPDServer {
    /// Whether plain HTTP/1.1 streams are handed over: `ServerConfiguration.detachesStreams`,
    /// never with TLS (libmicrohttpd's TLS session cannot be handed over).
    var detachesStreams: Bool { configuration.detachesStreams && configuration.tls == nil }

    /// A detached stream ended (its loop's thread, or `stop()`): stops watching its socket, tells
    /// the source (`HTTPEventSource.close()`), gives back its place in the limiter, and records
    /// the request.
    func detachedStreamEnded(_ stream: DetachedStream) {
        watcher.unwatch(fd: stream.fd)
        stream.source.close()
        openStreams.withLock { $0 -= 1 }
        limiter.release(stream.client)
        stream.record(
            FinishedRequest(
                method: stream.method, path: stream.path, status: stream.status, bytes: stream.bytesWritten,
                microseconds: (configuration.clock.now - stream.started).wholeMicroseconds, wasStream: true,
                remote: stream.remote))
    }
}

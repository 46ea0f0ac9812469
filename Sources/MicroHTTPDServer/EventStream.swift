import CMicroHTTPD
import ForgePushToken
import ForgePushTokenHTTP

/// One `GET /token/stream` response: the subscriber, its connection and its socket.
///
/// Retained by libmicrohttpd's response (the content reader's `cls`) until the free callback;
/// only the connection's polling thread reads or writes `bytesWritten`.
final class EventStream {
    let subscriber: EventSubscriber
    let connection: ConnectionHandle
    let fd: Int32
    unowned let server: MicroHTTPDServer
    var bytesWritten = 0

    init(subscriber: EventSubscriber, connection: ConnectionHandle, fd: Int32, server: MicroHTTPDServer) {
        self.subscriber = subscriber
        self.connection = connection
        self.fd = fd
        self.server = server
    }
}

/// A libmicrohttpd connection pointer that the event hub may use from the publishing thread, with
/// the loop that runs its daemon.
///
/// `@unchecked Sendable` is sound because the pointer is only ever passed to
/// `MHD_resume_connection`, which locks the daemon's connection lists and may be called from any
/// thread, and `EventSubscriber`'s protocol calls it only while the connection is suspended and
/// exactly once per suspension; a suspended connection is never closed, so the pointer is valid
/// whenever it is used. (The loop is `Sendable` itself.)
struct ConnectionHandle: @unchecked Sendable {
    let pointer: OpaquePointer
    let loop: DaemonLoop

    /// Resumes the connection and wakes its daemon's loop (which runs the daemon, which sends): at
    /// once from any thread but a loop's, after the loop's current daemon run from a loop's thread
    /// (see `DaemonLoop.wakeAfterRun`).
    func resume() {
        MHD_resume_connection(pointer)
        if let current = DaemonLoop.current {
            current.wakeAfterRun(loop)
        } else {
            loop.wake()
        }
    }
}

/// Answers `GET /token/stream`: registers a subscriber (or answers 503) and queues a chunked
/// response whose content reader is `mhdStreamReader`.
func openStream(on connection: OpaquePointer, context: RequestContext, daemon: DaemonContext) -> MHD_Result {
    let server = daemon.server
    let handle = ConnectionHandle(pointer: connection, loop: daemon.loop)
    let (head, subscriber) = server.responder.openEventStream(origin: context.head.headers["Origin"],
                                                                  wake: { handle.resume() })
    guard let subscriber else { return respond(head, on: connection, context: context) }
    let fd = fpt_connection_fd(connection)
    let stream = EventStream(subscriber: subscriber, connection: handle, fd: fd, server: server)
    let cls = Unmanaged.passRetained(stream).toOpaque()
    guard let response = MHD_create_response_from_callback(UInt64.max /* MHD_SIZE_UNKNOWN */, 256, mhdStreamReader, cls,
                                                           mhdStreamFree) else {
        Unmanaged<EventStream>.fromOpaque(cls).release()
        server.responder.hub.remove(subscriber.id)
        return .NO
    }
    addHeaders(head.headers, to: response)
    if fd >= 0 { server.watcher.watch(fd: fd, id: subscriber.id) }
    // A timeout of its own puts the connection on libmicrohttpd's list of connections with custom
    // timeouts, which every run of the daemon walks in full. That walk is what finishes a stream
    // ended with an error (a departed client): libmicrohttpd 0.9.75 marks such a connection closed
    // but leaves its cleanup to a later walk of a timeout list, and the list of connections with
    // the default timeout is walked only from its oldest entry up to the first one still open, so
    // one idle keep-alive connection from before kept every departed subscriber's socket open.
    // The timeout itself only counts while the stream has something to send and the client does
    // not take it (a suspended connection has none).
    _ = fpt_set_connection_timeout(connection, eventStreamStallSeconds)
    let result = MHD_queue_response(connection, UInt32(head.status), response)
    MHD_destroy_response(response)
    context.responded = true
    context.status = head.status
    context.stream = stream
    return result
}

/// `MHD_ContentReaderCallback` of an event stream: the next bytes, or a suspension while there is
/// nothing to send (never a bare 0, which would make libmicrohttpd spin), or the end.
func mhdStreamReader(_ cls: UnsafeMutableRawPointer?, _ position: UInt64, _ buffer: UnsafeMutablePointer<CChar>?,
                     _ max: Int) -> Int {
    guard let cls, let buffer else { return -2 }  // MHD_CONTENT_READER_END_WITH_ERROR
    let stream = Unmanaged<EventStream>.fromOpaque(cls).takeUnretainedValue()
    let result = stream.subscriber.read(into: UnsafeMutableRawBufferPointer(start: buffer, count: max)) {
        MHD_suspend_connection(stream.connection.pointer)
    }
    switch result {
    case .bytes(let count):
        stream.bytesWritten += count
        return count
    case .suspended:
        return 0
    case .endOfStream:
        return -1  // MHD_CONTENT_READER_END_OF_STREAM: the chunked body terminates cleanly
    case .abort:
        // The connection is closed, and cleaned up on the daemon's next run: make sure there is one.
        stream.connection.loop.wake()
        return -2  // MHD_CONTENT_READER_END_WITH_ERROR: the connection is closed
    }
}

/// Seconds an event stream may have something to send that its client does not take before
/// libmicrohttpd closes it (a client that stopped reading but did not close).
let eventStreamStallSeconds: UInt32 = 120

/// `MHD_ContentReaderFreeCallback`: the response is gone (before libmicrohttpd closes the socket).
/// Stops watching the socket, removes the subscriber and releases the stream.
func mhdStreamFree(_ cls: UnsafeMutableRawPointer?) {
    guard let cls else { return }
    let stream = Unmanaged<EventStream>.fromOpaque(cls).takeRetainedValue()
    if stream.fd >= 0 { stream.server.watcher.unwatch(fd: stream.fd) }
    stream.server.responder.hub.remove(stream.subscriber.id)
}

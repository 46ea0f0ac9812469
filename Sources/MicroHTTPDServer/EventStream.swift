import CMicroHTTPD
import ForgePushToken
import HTTPServing
import ServerSupport

/// An event stream's response as libmicrohttpd's content reader sees it (`mhdStreamReader`,
/// `mhdStreamFree`): the base of `EventStream<Application>`, whose overrides read the
/// application's source with its type known (the C callbacks cannot be generic; see
/// `DaemonContext`). Never made alone.
///
/// Retained by libmicrohttpd's response (the content reader's `cls`) until the free callback;
/// only the connection's polling thread reads or writes `bytesWritten`.
class StreamResponse {
    /// Body bytes sent so far (for the records).
    var bytesWritten = 0

    /// The content reader: the next bytes of the stream into `buffer`, a suspension of the
    /// connection while there is nothing to send, or the end (`ContentReaderResult`).
    func read(into buffer: UnsafeMutableRawBufferPointer) -> Int {
        preconditionFailure("StreamResponse is only made as an EventStream")
    }

    /// The response is gone.
    func close() {
        preconditionFailure("StreamResponse is only made as an EventStream")
    }
}

/// One event-stream response: the application's source (`HTTPEventSource`), its connection and
/// its socket.
final class EventStream<Application: HTTPApplication>: StreamResponse {
    /// The source, as an existential: each read calls its witness directly, where through
    /// `Application.EventSource` this generic class's (unspecialized) `read` looked the
    /// associated type up in the runtime's metadata cache on every call. The service's source
    /// (`ServiceEventStream`, three references) fits the existential's inline buffer; a larger
    /// one would be boxed on the heap, once per stream.
    let source: any HTTPEventSource
    let connection: ConnectionHandle
    let fd: Int32
    unowned let server: MicroHTTPDServer<Application>

    init(
        source: Application.EventSource, connection: ConnectionHandle, fd: Int32, server: MicroHTTPDServer<Application>
    ) {
        self.source = source
        self.connection = connection
        self.fd = fd
        self.server = server
        server.openStreams.withLock { $0 += 1 }
    }

    override func read(into buffer: UnsafeMutableRawBufferPointer) -> Int {
        let result = source.read(into: buffer) {
            MHD_suspend_connection(connection.pointer)
        }
        switch result {
        case .bytes(let count):
            bytesWritten += count
            return count
        case .suspended:
            return 0
        case .endOfStream:
            return ContentReaderResult.endOfStream  // the chunked body terminates cleanly
        case .abort:
            // The connection is closed, and cleaned up on the daemon's next run: make sure there is one.
            connection.loop.wake()
            return ContentReaderResult.endWithError
        }
    }

    /// The response is gone (`mhdStreamFree`): stops watching the socket, and tells the source
    /// (`HTTPEventSource.close()`: the application forgets it and counts its end).
    override func close() {
        if fd >= 0 { server.watcher.unwatch(fd: fd) }
        source.close()
        server.openStreams.withLock { $0 -= 1 }
    }
}

/// A libmicrohttpd connection pointer that the application may resume from any thread (a
/// stream's wake-up, a write's answer), with the loop that runs its daemon.
///
/// `@unchecked Sendable` is sound because the pointer is only ever passed to
/// `MHD_resume_connection`, which locks the daemon's connection lists and may be called from any
/// thread, and `HTTPEventSource`'s and `PendingResponse`'s protocols call it only while the
/// connection is suspended and exactly once per suspension; a suspended connection is never
/// closed, so the pointer is valid whenever it is used. (The loop is `Sendable` itself.)
struct ConnectionHandle: @unchecked Sendable {
    let pointer: OpaquePointer
    let loop: DaemonLoop

    /// Resumes the connection and wakes its daemon's loop (which runs the daemon, which sends):
    /// when the work in progress on this thread ends if it is a `WakeBatch` (a daemon run, a
    /// delivery), at once otherwise (see `DaemonLoop`).
    func resume() {
        MHD_resume_connection(pointer)
        if !WakeBatch.wakeLater(loop) { loop.wake() }
    }
}

extension Daemon {
    /// Opens the event stream `admitted` asked for (`HTTPApplication.openStream(for:wake:)`), or
    /// answers its refusal, and queues a chunked response whose content reader is
    /// `mhdStreamReader`.
    func openStream(_ admitted: Application.Admitted, on connection: OpaquePointer, context: RequestContext)
        -> MHD_Result
    {
        let handle = ConnectionHandle(pointer: connection, loop: loop)
        let (head, source) = application.openStream(for: admitted, wake: { handle.resume() })
        guard let source else { return respond(head, on: connection, context: context) }
        let fd = fpt_connection_fd(connection)
        let stream = EventStream(source: source, connection: handle, fd: fd, server: server)
        let cls = Unmanaged<StreamResponse>.passRetained(stream).toOpaque()
        guard
            let response = MHD_create_response_from_callback(
                responseSizeUnknown, streamResponseBlockBytes, mhdStreamReader, cls,
                mhdStreamFree)
        else {
            Unmanaged<StreamResponse>.fromOpaque(cls).release()
            stream.close()
            return .NO
        }
        addHeaders(head.headers, to: response, crossOrigin: context.crossOrigin, origin: context.origin)
        if fd >= 0 { server.watcher.watch(fd: fd, id: source.id) }
        deadlines.forget(connection)  // an established stream has no deadline
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
        context.machine.sent()
        context.status = head.status
        context.stream = stream
        return result
    }
}

/// The block size given to `MHD_create_response_from_callback` for an event stream: libmicrohttpd
/// allocates it with the response, one per subscriber, but a chunked body (every HTTP/1.1
/// stream) is read straight into the connection's write buffer and never uses it
/// (libmicrohttpd 0.9.75, `try_ready_chunked_body` in its connection.c). Only an HTTP/1.0 stream, sent
/// unchunked until the connection closes, is read through it, in pieces of this size. 64 bytes
/// instead of 256 is 192 bytes less per subscriber (docs/performance.md, "Memory per subscriber").
let streamResponseBlockBytes = 64

/// Seconds an event stream may have something to send that its client does not take before
/// libmicrohttpd closes it (a client that stopped reading but did not close).
let eventStreamStallSeconds: UInt32 = 120

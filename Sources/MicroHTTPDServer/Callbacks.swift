import CMicroHTTPD
import ForgePushToken
import HTTPServing
import ServerSupport

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

// Every function libmicrohttpd calls, in one place: the C boundary of the server. Each is a
// module-level, nonisolated function passed as a C function pointer (`@convention(c)`), run on
// a daemon's thread (DaemonLoop); each unwraps its C arguments and hands over to Swift code in
// RequestHandling.swift, RequestFramingCheck.swift, EventStream.swift or ConnectionLimits.swift.
// Their contracts are the libmicrohttpd manual's "microhttpd-cb" section. `cls` is always the
// daemon's `DaemonContext` (a `Daemon<Application>`), unretained (the server outlives its
// daemons), except for the stream callbacks (a `StreamResponse`, an `EventStream<Application>`),
// the logger (a `LogBox`) and the framing and trailer iterators (the caller's `FramingScan` or
// `TrailerScan`, on its stack for the one call).

/// `MHD_AccessHandlerCallback`: called once with the header fields (`*con_cls` empty or a flawed
/// target, `RequestSlot`), once per piece of body, and once more with `*upload_data_size == 0` when the body is
/// complete (and again after a suspended connection is resumed).
func mhdAccessHandler(
    _ cls: UnsafeMutableRawPointer?, _ connection: OpaquePointer?, _ url: UnsafePointer<CChar>?,
    _ method: UnsafePointer<CChar>?, _ version: UnsafePointer<CChar>?, _ uploadData: UnsafePointer<CChar>?,
    _ uploadSize: UnsafeMutablePointer<Int>?, _ contextSlot: UnsafeMutablePointer<UnsafeMutableRawPointer?>?
) -> MHD_Result {
    guard let cls, let connection, let url, let method, let uploadSize, let contextSlot else { return .NO }
    return Unmanaged<DaemonContext>.fromOpaque(cls).takeUnretainedValue().accessHandler(
        connection: connection, url: url, method: method, version: version, uploadData: uploadData,
        uploadSize: uploadSize, slot: contextSlot)
}

/// `MHD_RequestCompletedCallback`: the request is over (answered, or its connection closed).
func mhdRequestCompleted(
    _ cls: UnsafeMutableRawPointer?, _ connection: OpaquePointer?,
    _ contextSlot: UnsafeMutablePointer<UnsafeMutableRawPointer?>?, _ code: MHD_RequestTerminationCode
) {
    guard let cls else { return }
    let daemon = Unmanaged<DaemonContext>.fromOpaque(cls).takeUnretainedValue()
    if let connection { daemon.deadlines.completed(connection, at: daemon.clock.now) }
    guard let contextSlot else { return }
    daemon.requestCompleted(RequestSlot.take(from: contextSlot), connection: connection)
}

/// `MHD_AcceptPolicyCallback`: admits a new connection or has libmicrohttpd close it at once,
/// before it allocates anything for it.
func mhdAcceptPolicy(_ cls: UnsafeMutableRawPointer?, _ address: UnsafePointer<sockaddr>?, _ length: socklen_t)
    -> MHD_Result
{
    guard let cls else { return .NO }
    let daemon = Unmanaged<DaemonContext>.fromOpaque(cls).takeUnretainedValue()
    return daemon.admitConnection(from: address.flatMap(ClientAddress.init)) ? .YES : .NO
}

/// `MHD_NotifyConnectionCallback`: a connection started or closed.
func mhdConnectionNotify(
    _ cls: UnsafeMutableRawPointer?, _ connection: OpaquePointer?,
    _ socketContext: UnsafeMutablePointer<UnsafeMutableRawPointer?>?,
    _ code: MHD_ConnectionNotificationCode
) {
    guard let cls, let connection, let socketContext else { return }
    let daemon = Unmanaged<DaemonContext>.fromOpaque(cls).takeUnretainedValue()
    switch code.rawValue {
    case ConnectionNotification.started:
        // Non-nil: also marks a connection that holds a place in the `ConnectionLimiter`.
        socketContext.pointee = daemon.deadlines.connected(connection, at: daemon.clock.now)
    case ConnectionNotification.closed:
        guard let context = socketContext.pointee else { return }
        socketContext.pointee = nil
        daemon.deadlines.closed(connection, context: context)
        // A handed-over connection's place is its detached stream's now (released when it ends).
        if daemon.detached.releaseHandOver(connection) { return }
        daemon.limiter.release(fpt_connection_address(connection).flatMap(ClientAddress.init))
    default:
        return
    }
}

/// The URI-log callback (`MHD_OPTION_URI_LOG_CALLBACK`): sees each request target as sent, before
/// it is parsed. Its result becomes the request's first `*con_cls`: a `RequestSlot`, empty or a
/// flawed target (`targetFlaw`).
func mhdURILog(_ cls: UnsafeMutableRawPointer?, _ uri: UnsafePointer<CChar>?, _ connection: OpaquePointer?)
    -> UnsafeMutableRawPointer?
{
    guard let cls, let uri else { return nil }
    let limit = Unmanaged<DaemonContext>.fromOpaque(cls).takeUnretainedValue().maxURLBytes
    return targetFlaw(uri, limit: limit).map { RequestSlot.flawedTarget($0) }?.word
}

/// `MHD_ContentReaderCallback` of an event stream: the next bytes, or a suspension while there is
/// nothing to send (never a bare 0 without one, which would make libmicrohttpd spin), or the end.
func mhdStreamReader(
    _ cls: UnsafeMutableRawPointer?, _ position: UInt64, _ buffer: UnsafeMutablePointer<CChar>?,
    _ max: Int
) -> Int {
    guard let cls, let buffer else { return ContentReaderResult.endWithError }
    let stream = Unmanaged<StreamResponse>.fromOpaque(cls).takeUnretainedValue()
    return stream.read(into: UnsafeMutableRawBufferPointer(start: buffer, count: max))
}

/// `MHD_ContentReaderFreeCallback`: an event stream's response is gone (before libmicrohttpd
/// closes the socket).
func mhdStreamFree(_ cls: UnsafeMutableRawPointer?) {
    guard let cls else { return }
    Unmanaged<StreamResponse>.fromOpaque(cls).takeRetainedValue().close()
}

/// `MHD_KeyValueIteratorN` of `scanFraming`: one record of a request's head (a header field, query
/// argument or cookie), counted into the `FramingScan` that `cls` points to, and kept there when
/// its name is one the scan's `HeadFieldCapture` holds. Keys and values come with their full
/// lengths, NULs included.
func mhdFramingIterator(
    _ cls: UnsafeMutableRawPointer?, _ kind: MHD_ValueKind, _ key: UnsafePointer<CChar>?, _ keySize: Int,
    _ value: UnsafePointer<CChar>?, _ valueSize: Int
) -> MHD_Result {
    guard let cls else { return .YES }
    let scan = cls.assumingMemoryBound(to: FramingScan.self)
    guard let key, kind == .HEADER_KIND else {
        scan.pointee.counts.countRecord()
        if let key, kind == .GET_ARGUMENT_KIND {
            scan.pointee.keep(name: key, count: keySize, value: value, isArgument: true)
        }
        return .YES
    }
    scan.pointee.keep(name: key, count: keySize, value: value, isArgument: false)
    if scan.pointee.firstName == nil { scan.pointee.firstName = key }
    scan.pointee.place(name: key, value: value, valueCount: valueSize)
    scan.pointee.counts.countHeader(
        name: UnsafeRawBufferPointer(start: key, count: keySize),
        value: value.map { UnsafeRawBufferPointer(start: $0, count: valueSize) })
    return .YES
}

/// `MHD_KeyValueIteratorN` of `trailerRefusal`: one trailer field of a chunked body, counted into
/// the `TrailerScan` that `cls` points to.
func mhdTrailerIterator(
    _ cls: UnsafeMutableRawPointer?, _ kind: MHD_ValueKind, _ key: UnsafePointer<CChar>?, _ keySize: Int,
    _ value: UnsafePointer<CChar>?, _ valueSize: Int
) -> MHD_Result {
    guard let cls, let key else { return .YES }
    cls.assumingMemoryBound(to: TrailerScan.self).pointee.count(name: key, value: value, valueCount: valueSize)
    return .YES
}

/// libmicrohttpd's own error messages (`MHD_OPTION_EXTERNAL_LOGGER`, through the shim's
/// trampoline, which formats them).
func mhdLog(_ cls: UnsafeMutableRawPointer?, _ message: UnsafePointer<CChar>?) {
    guard let cls, let message else { return }
    let box = Unmanaged<LogBox>.fromOpaque(cls).takeUnretainedValue()
    box.logLibraryMessage(message)
}

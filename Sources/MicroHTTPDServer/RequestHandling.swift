import CMicroHTTPD
import ForgePushToken
import ForgePushTokenHTTP
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

// libmicrohttpd's callbacks. Each is a module-level, nonisolated function passed as a C function
// pointer; each runs on libmicrohttpd's polling thread. The manual's "microhttpd-cb" section
// describes their contracts.

/// Per-request state, owned by libmicrohttpd's `*con_cls` from the first access-handler call until
/// the request-completed callback. Only the connection's polling thread touches it.
final class RequestContext {
    let method: String
    let path: String
    let started = ContinuousClock.now
    var body: [UInt8] = []
    var tooLarge = false
    var responded = false
    var status = 0
    var bytes = 0
    var stream: EventStream?

    init(method: String, path: String) {
        self.method = method
        self.path = path
    }
}

/// `MHD_AccessHandlerCallback`. libmicrohttpd calls it once with the headers (`*con_cls` still
/// NULL), once per piece of body, and once more with `*upload_data_size == 0` when the body is
/// complete. Answers go out in a later call than the first, which keeps the connection alive; the
/// exception is a `Content-Length` over the limit, answered 413 at once (the body is never read and
/// libmicrohttpd closes the connection).
func mhdAccessHandler(
    _ cls: UnsafeMutableRawPointer?, _ connection: OpaquePointer?, _ url: UnsafePointer<CChar>?,
    _ method: UnsafePointer<CChar>?, _ version: UnsafePointer<CChar>?, _ uploadData: UnsafePointer<CChar>?,
    _ uploadSize: UnsafeMutablePointer<Int>?, _ contextSlot: UnsafeMutablePointer<UnsafeMutableRawPointer?>?
) -> MHD_Result {
    guard let cls, let connection, let url, let method, let uploadSize, let contextSlot else { return .NO }
    let server = Unmanaged<MicroHTTPDServer>.fromOpaque(cls).takeUnretainedValue()
    let limit = server.configuration.maxBodyBytes

    guard let existing = contextSlot.pointee else {
        let context = RequestContext(method: String(cString: method), path: String(cString: url))
        contextSlot.pointee = Unmanaged.passRetained(context).toOpaque()
        server.inFlight.withLock { $0 += 1 }
        if let length = header(connection, "Content-Length").flatMap({ UInt64($0) }), length > UInt64(limit) {
            context.tooLarge = true
            return respond(Responder.payloadTooLarge(limit: limit), on: connection, context: context)
        }
        return .YES
    }
    let context = Unmanaged<RequestContext>.fromOpaque(existing).takeUnretainedValue()

    if uploadSize.pointee > 0 {
        let count = uploadSize.pointee
        if !context.tooLarge, let uploadData {
            if context.body.count + count > limit {
                context.tooLarge = true
                context.body = []
            } else {
                uploadData.withMemoryRebound(to: UInt8.self, capacity: count) {
                    context.body.append(contentsOf: UnsafeBufferPointer(start: $0, count: count))
                }
            }
        }
        uploadSize.pointee = 0
        return .YES
    }
    if context.responded { return .YES }
    if context.tooLarge {
        return respond(Responder.payloadTooLarge(limit: limit), on: connection, context: context)
    }

    var headers = HTTPHeaders()
    if let type = header(connection, "Content-Type") { headers.add("Content-Type", type) }
    let request = HTTPRequest(method: context.method, target: context.path, headers: headers, body: context.body)
    context.body = []
    switch server.responder.respond(to: request) {
    case .response(let response):
        return respond(response, on: connection, context: context)
    case .eventStream:
        return openStream(on: connection, context: context, server: server)
    }
}

/// `MHD_RequestCompletedCallback`: the request is over (answered, or its connection closed).
/// Writes the access-log line and releases the request's context.
func mhdRequestCompleted(
    _ cls: UnsafeMutableRawPointer?, _ connection: OpaquePointer?,
    _ contextSlot: UnsafeMutablePointer<UnsafeMutableRawPointer?>?, _ code: MHD_RequestTerminationCode
) {
    guard let cls, let contextSlot, let raw = contextSlot.pointee else { return }
    contextSlot.pointee = nil
    let server = Unmanaged<MicroHTTPDServer>.fromOpaque(cls).takeUnretainedValue()
    let context = Unmanaged<RequestContext>.fromOpaque(raw).takeRetainedValue()
    server.inFlight.withLock { $0 -= 1 }
    guard server.configuration.accessLog else { return }
    let elapsed = ContinuousClock.now - context.started
    let micros = elapsed.components.seconds * 1_000_000 + elapsed.components.attoseconds / 1_000_000_000_000
    let bytes = context.stream?.bytesWritten ?? context.bytes
    let status = context.status == 0 ? "-" : String(context.status)
    server.log.log(.info, "\(context.method) \(context.path) \(status) \(bytes) bytes \(micros) us")
}

/// Queues a complete response (libmicrohttpd copies the body).
func respond(_ response: HTTPResponse, on connection: OpaquePointer, context: RequestContext) -> MHD_Result {
    let body = response.body
    let mhdResponse = body.withUnsafeBytes {
        MHD_create_response_from_buffer(body.count, UnsafeMutableRawPointer(mutating: $0.baseAddress),
                                        .RESPMEM_MUST_COPY)
    }
    guard let mhdResponse else { return .NO }
    addHeaders(response.headers, to: mhdResponse)
    let result = MHD_queue_response(connection, UInt32(response.status), mhdResponse)
    MHD_destroy_response(mhdResponse)
    context.responded = true
    context.status = response.status
    context.bytes = body.count
    return result
}

func addHeaders(_ headers: HTTPHeaders, to response: OpaquePointer) {
    for field in headers {
        _ = MHD_add_response_header(response, field.name, field.value)
    }
}

/// The value of request header `name`, or `nil`.
func header(_ connection: OpaquePointer, _ name: String) -> String? {
    MHD_lookup_connection_value(connection, .HEADER_KIND, name).map { String(cString: $0) }
}

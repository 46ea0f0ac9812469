import CMicroHTTPD
import ForgePushToken
import ForgePushTokenHTTP

/// One libmicrohttpd response for `GET /token` (and `HEAD /token`) per token version, queued on
/// every request of that version.
///
/// A libmicrohttpd response is reference-counted: `MHD_queue_response` takes a reference for the
/// connection and drops it when the connection is done with it. The cache holds one more reference
/// for as long as its version is current; when the version changes, the next request builds the new
/// response (once) and the cache drops its reference to the old one, which libmicrohttpd frees when
/// the last connection sending it lets go. So a read costs two uncontended lock acquisitions and no
/// allocation, encoding or copy: the body was rendered once per version by `TokenSnapshot`.
///
/// Thread-safety: all members may be called from any thread (libmicrohttpd's response functions
/// lock the response's own mutex). The pointer is kept as its bit pattern, an `Int`, so the state is
/// plainly `Sendable`.
final class TokenResponseCache: Sendable {
    struct Entry: Sendable {
        let version: UInt64
        /// `OpaquePointer` bit pattern of the `MHD_Response`.
        let response: Int
        let bodyCount: Int
    }

    private let entry = Locked<Entry?>(nil)

    /// Queues the current token response on `connection` (a 200; for `HEAD` libmicrohttpd sends
    /// the same header fields without the body).
    /// - Returns: libmicrohttpd's result and the body size (for the access log).
    func queue(on connection: OpaquePointer, responder: Responder) -> (result: MHD_Result, bytes: Int) {
        let version = responder.tokenVersion
        // The owner's lock nests inside the cache's (never the other way round).
        return entry.withLock { entry -> (result: MHD_Result, bytes: Int) in
            if entry?.version != version {
                let (snapshot, tokenResponse) = responder.tokenReadResponse()
                guard let response = makeResponse(tokenResponse) else { return (.NO, 0) }
                if let old = entry { MHD_destroy_response(OpaquePointer(bitPattern: old.response)) }
                entry = Entry(version: snapshot.version, response: Int(bitPattern: response),
                              bodyCount: snapshot.tokenBody.count)
            }
            let current = entry!
            let result = MHD_queue_response(connection, 200, OpaquePointer(bitPattern: current.response))
            return (result, current.bodyCount)
        }
    }

    /// Drops the cache's reference (after the daemon has stopped).
    func clear() {
        entry.withLock { entry in
            if let old = entry { MHD_destroy_response(OpaquePointer(bitPattern: old.response)) }
            entry = nil
        }
    }
}

/// A libmicrohttpd response holding a copy of `response`'s body and its header fields; the caller
/// owns the one reference.
func makeResponse(_ response: HTTPResponse) -> OpaquePointer? {
    let body = response.body
    let mhdResponse = body.withUnsafeBytes {
        MHD_create_response_from_buffer(body.count, UnsafeMutableRawPointer(mutating: $0.baseAddress),
                                        .RESPMEM_MUST_COPY)
    }
    guard let mhdResponse else { return nil }
    addHeaders(response.headers, to: mhdResponse)
    return mhdResponse
}

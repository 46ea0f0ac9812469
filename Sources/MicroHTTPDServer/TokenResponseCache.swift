import CMicroHTTPD
import ForgePushToken
import ForgePushTokenHTTP
import ForgePushTokenOwner

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// One libmicrohttpd response for `GET /token` (and `HEAD /token`) per token version, and its
/// `304 Not Modified`, queued on every request of that version.
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
        /// `OpaquePointer` bit patterns of the `MHD_Response`s: the 200 and its 304.
        let response: Int
        let notModified: Int
        let bodyCount: Int
        let entityTag: EntityTag
    }

    private let entry = Locked<Entry?>(nil)

    /// Queues the current token response on `connection`: the 200 (for `HEAD` libmicrohttpd sends
    /// the same header fields without the body), or its `304 Not Modified` when `ifNoneMatch` (the
    /// request's `If-None-Match` field value, a C string, or `nil`) matches the current `ETag`.
    /// - Returns: libmicrohttpd's result, the status queued and the body size (for the access log).
    func queue(
        on connection: OpaquePointer, responder: Responder,
        ifNoneMatch: UnsafePointer<CChar>?
    ) -> (result: MHD_Result, status: Int, bytes: Int) {
        let version = responder.owner.version
        // The owner's lock nests inside the cache's (never the other way round).
        return entry.withLock { entry -> (result: MHD_Result, status: Int, bytes: Int) in
            if entry?.version != version {
                let (snapshot, full, conditional) = responder.tokenReadResponses()
                // Only served while CORS is off (`Responder.answersTokenReadsBlindly`): no CORS fields.
                let off = CrossOriginPolicy()
                guard let response = makeResponse(full, crossOrigin: off, origin: nil) else { return (.NO, 500, 0) }
                guard let notModified = makeResponse(conditional, crossOrigin: off, origin: nil) else {
                    MHD_destroy_response(response)
                    return (.NO, 500, 0)
                }
                if let old = entry { Self.destroy(old) }
                entry = Entry(
                    version: snapshot.version, response: Int(bitPattern: response),
                    notModified: Int(bitPattern: notModified), bodyCount: snapshot.tokenBody.count,
                    entityTag: snapshot.entityTag)
            }
            // Only a conditional request reads the tag (the unconditional one copies no String).
            if let ifNoneMatch, let tag = entry?.entityTag,
                IfNoneMatch.matches(
                    UnsafeBufferPointer(
                        start: UnsafeRawPointer(ifNoneMatch).assumingMemoryBound(to: UInt8.self),
                        count: strlen(ifNoneMatch)), current: tag)
            {
                let result = MHD_queue_response(connection, 304, OpaquePointer(bitPattern: entry!.notModified))
                return (result, 304, 0)
            }
            let result = MHD_queue_response(connection, 200, OpaquePointer(bitPattern: entry!.response))
            return (result, 200, entry!.bodyCount)
        }
    }

    /// Drops the cache's reference (after the daemon has stopped).
    func clear() {
        entry.withLock { entry in
            if let old = entry { Self.destroy(old) }
            entry = nil
        }
    }

    private static func destroy(_ entry: Entry) {
        MHD_destroy_response(OpaquePointer(bitPattern: entry.response))
        MHD_destroy_response(OpaquePointer(bitPattern: entry.notModified))
    }
}

/// A libmicrohttpd response holding a copy of `response`'s body and its header fields, completed
/// for a request from `origin` (`addHeaders`); the caller owns the one reference.
func makeResponse(_ response: HTTPResponse, crossOrigin: CrossOriginPolicy, origin: String?) -> OpaquePointer? {
    let body = response.body
    let mhdResponse = body.withUnsafeBytes {
        MHD_create_response_from_buffer(
            body.count, UnsafeMutableRawPointer(mutating: $0.baseAddress),
            .RESPMEM_MUST_COPY)
    }
    guard let mhdResponse else { return nil }
    addHeaders(response.headers, to: mhdResponse, crossOrigin: crossOrigin, origin: origin)
    return mhdResponse
}

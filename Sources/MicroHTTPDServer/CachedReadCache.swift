import CMicroHTTPD
import ForgePushToken
import HTTPServing

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// One libmicrohttpd response for the cached read (`HTTPCachedReads.cachedRead()`: `GET /token`,
/// and `HEAD`) per version, and its `304 Not Modified`, queued on every request of that version.
///
/// A libmicrohttpd response is reference-counted: `MHD_queue_response` takes a reference for the
/// connection and drops it when the connection is done with it. The cache holds one more reference
/// for as long as its version is current; when the version changes, the next request builds the new
/// response (once) and the cache drops its reference to the old one, which libmicrohttpd frees when
/// the last connection sending it lets go. So a read costs two uncontended lock acquisitions (the
/// application's version, this cache) and no allocation, encoding or copy.
///
/// Thread-safety: all members may be called from any thread (libmicrohttpd's response functions
/// lock the response's own mutex; the entry is behind this cache's lock).
final class CachedReadCache: Sendable {
    struct Entry: Sendable {
        let version: UInt64
        /// The 200.
        let response: ResponseHandle
        /// Its 304.
        let notModified: ResponseHandle
        let bodyCount: Int
        let entityTag: EntityTag
    }

    private let entry = Locked<Entry?>(nil)

    /// Queues the current cached read on `connection`: the 200 (for `HEAD` libmicrohttpd sends
    /// the same header fields without the body), or its `304 Not Modified` when `ifNoneMatch` (the
    /// request's `If-None-Match` field value, a C string, or `nil`) matches the current `ETag`.
    /// - Returns: libmicrohttpd's result, the status queued and the body size (for the records).
    func queue(
        on connection: OpaquePointer, application: any HTTPCachedReads, ifNoneMatch: UnsafePointer<CChar>?
    ) -> (result: MHD_Result, status: Int, bytes: Int) {
        let version = application.cachedReadVersion
        // The application's lock nests inside the cache's (never the other way round).
        return entry.withLock { entry -> (result: MHD_Result, status: Int, bytes: Int) in
            let current: Entry
            if let entry, entry.version == version {
                current = entry
            } else {
                guard let fresh = Self.make(application.cachedRead()) else { return (.NO, 500, 0) }
                if let old = entry { Self.destroy(old) }
                entry = fresh
                current = fresh
            }
            // Only a conditional request reads the tag (the unconditional one copies no String).
            if let ifNoneMatch,
                IfNoneMatch.matches(
                    UnsafeBufferPointer(
                        start: UnsafeRawPointer(ifNoneMatch).assumingMemoryBound(to: UInt8.self),
                        count: strlen(ifNoneMatch)), current: current.entityTag)
            {
                return (MHD_queue_response(connection, 304, current.notModified.pointer), 304, 0)
            }
            return (MHD_queue_response(connection, 200, current.response.pointer), 200, current.bodyCount)
        }
    }

    /// Drops the cache's reference (after the daemon has stopped).
    func clear() {
        entry.withLock { entry in
            if let old = entry { Self.destroy(old) }
            entry = nil
        }
    }

    /// The libmicrohttpd responses of `read`, or `nil` when libmicrohttpd could not make them.
    private static func make(_ read: CachedRead) -> Entry? {
        // Only served while no header field changes the answer (`answersCachedReadsBlindly`):
        // no CORS fields.
        let off = CrossOriginPolicy()
        guard let response = makeResponse(read.response, crossOrigin: off, origin: nil) else { return nil }
        guard let notModified = makeResponse(read.notModified, crossOrigin: off, origin: nil) else {
            MHD_destroy_response(response)
            return nil
        }
        return Entry(
            version: read.version, response: ResponseHandle(pointer: response),
            notModified: ResponseHandle(pointer: notModified), bodyCount: read.response.body.count,
            entityTag: read.entityTag)
    }

    private static func destroy(_ entry: Entry) {
        MHD_destroy_response(entry.response.pointer)
        MHD_destroy_response(entry.notModified.pointer)
    }
}

/// A libmicrohttpd response (`struct MHD_Response *`) that the cache holds one reference to.
///
/// `@unchecked Sendable` is sound because the pointer is only passed to functions that
/// libmicrohttpd makes safe from any thread for a response (`MHD_queue_response`, which takes a
/// reference under the response's own mutex, and `MHD_destroy_response`, which drops one under it),
/// the response is never changed after it was made (its header fields are added before it is
/// stored), and the cache's one reference is dropped only under the cache's lock, after which no
/// copy of the handle is used.
struct ResponseHandle: @unchecked Sendable {
    let pointer: OpaquePointer
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

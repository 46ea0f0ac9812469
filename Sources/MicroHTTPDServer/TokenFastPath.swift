import CMicroHTTPD
import ForgePushToken
import ForgePushTokenHTTP

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

// The allocation-free path of `GET` and `HEAD /token` (taken only while
// `Responder.answersTokenReadsBlindly`): the first access-handler call marks the request's slot
// (`SlotMarker.tokenGet`, `.tokenHead`) instead of allocating a `RequestContext`, and the second
// queues the `TokenResponseCache`'s response for the current version.

/// The request's `If-None-Match` field value, as libmicrohttpd keeps it (no copy).
func ifNoneMatch(_ connection: OpaquePointer) -> UnsafePointer<CChar>? {
    MHD_lookup_connection_value(connection, .HEADER_KIND, "If-None-Match")
}

/// `SlotMarker.tokenGet` or `.tokenHead` when `method` and `url` (as libmicrohttpd passes them: the
/// path without the query) are a `GET` or `HEAD` of `/token`. `strcmp` on the C strings: no
/// `String` is made.
func tokenRead(_ method: UnsafePointer<CChar>, _ url: UnsafePointer<CChar>) -> UnsafeMutableRawPointer? {
    guard strcmp(url, "/token") == 0 else { return nil }
    if strcmp(method, "GET") == 0 { return RequestSlot.tokenReadMarker(isHead: false, notModified: false) }
    if strcmp(method, "HEAD") == 0 { return RequestSlot.tokenReadMarker(isHead: true, notModified: false) }
    return nil
}

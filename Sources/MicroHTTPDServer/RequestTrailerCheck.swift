import CMicroHTTPD
import ForgePushToken
import HTTPServing

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

// The check of a chunked body's trailer fields (issue 27 §6), in the access-handler call where
// the body is complete: the last moment before a write is carried out.

/// What one pass over a request's trailer fields (`MHD_FOOTER_KIND`) found: how many, the bytes
/// of their lines as libmicrohttpd holds them, and whether one was folded.
///
/// libmicrohttpd 0.9.75 reads trailer lines as it reads the head (src/microhttpd/connection.c,
/// `MHD_CONNECTION_BODY_RECEIVED` and after): in place in its read buffer, which it grows for a
/// long line and never gives back for this request, with a record per field from the pool's end.
/// A large trailer can therefore leave no room for the answer: the write was carried out and the
/// connection closed unanswered (a 7.6 KB trailer at the default 8 KiB pool), or, a little
/// larger, libmicrohttpd answered its own `431` and nothing was carried out.
struct TrailerScan {
    /// Trailer fields.
    var records = 0
    /// Their lines' bytes: from each name to the end of its value, and its line end (2).
    var bytes = 0
    /// Fields whose name libmicrohttpd moved out of place (a folded line appended to it).
    var folded = 0

    /// Counts one trailer field: its `name` and `value` (`valueCount` bytes) as libmicrohttpd
    /// lists them.
    mutating func count(name: UnsafePointer<CChar>, value: UnsafePointer<CChar>?, valueCount: Int) {
        records += 1
        guard let value, value > name, name.distance(to: value) <= Int(UInt16.max) else {
            folded += 1
            return
        }
        bytes += name.distance(to: value) + valueCount + 2
    }
}

/// The answer refusing `connection`'s trailer fields, or `nil` to carry the request out. Refused:
/// trailer fields that, with a head of `headCost` (`RequestContext.headCost`), are over `budget`
/// (`431 header_fields_too_large`: counted as if they were header fields, the answer's header block
/// is then sure to fit in the pool, `RequestHeadBudget`), or a folded trailer field (`400`, as in
/// the head). With `Connection: close`.
///
/// Consistently, a chunked request whose trailer is too large is never carried out: answered
/// this `431`, or, when not even it fits beside the trailer in the pool, closed unanswered by
/// libmicrohttpd (which answers its own `431` when the trailer does not fit at all). docs/http-api.md.
func trailerRefusal(
    _ connection: OpaquePointer, headCost: (bytes: Int, records: Int, cookieValueBytes: Int?),
    budget: RequestHeadBudget
) -> HTTPResponse? {
    var scan = TrailerScan()
    _ = withUnsafeMutablePointer(to: &scan) { pointer in
        MHD_get_connection_values_n(connection, .FOOTER_KIND, mhdTrailerIterator, pointer)
    }
    guard scan.records > 0 else { return nil }
    let close: HTTPHeaders = ["Connection": "close"]
    if scan.folded > 0 {
        return .error(
            400,
            ServiceError("invalid_request", "a trailer field continues on the next line (obs-fold, RFC 9112 §5.2)"),
            headers: close)
    }
    // The trailer's lines and the blank line after them, as if they were more of the head.
    let admitted = budget.admits(
        headBytes: headCost.bytes + scan.bytes + 2, records: headCost.records + scan.records,
        cookieValueBytes: headCost.cookieValueBytes)
    if admitted { return nil }
    return .error(
        431,
        ServiceError(
            "header_fields_too_large",
            "the request's header and trailer fields are over \(budget.maxHeaderBytes) bytes"
                + " (each field, query argument and cookie counting 48 more)"),
        headers: close)
}

import CMicroHTTPD
import ForgePushToken
import ForgePushTokenHTTP

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

// The framing checks of a request's head, as the engine reads it from libmicrohttpd: one pass
// over its records (`scanFraming`), whose facts `RequestFraming` and `RequestHeadBudget`
// (ForgePushTokenHTTP) decide on as plain values, and the answers to targets that `mhdURILog`
// marked.

/// What one pass over a request's records found: the counts (`RequestFraming.FieldCounts`), where
/// the first header field's name lies in libmicrohttpd's read buffer, and the head's size.
struct FramingScan {
    var counts = RequestFraming.FieldCounts()
    /// The first header field's name as it lies in libmicrohttpd's read buffer (`nil` without
    /// one): where the line after the request line starts.
    var firstName: UnsafePointer<CChar>?
    /// `MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE`: the head's bytes as sent, from the method to the
    /// end of the blank line.
    var headBytes = 0
}

/// Reads `connection`'s header fields, query arguments and cookies in one pass
/// (`MHD_get_connection_values_n` with `mhdFramingIterator`, through `fpt_get_head_records`) and the head's size. Allocates
/// nothing.
func scanFraming(_ connection: OpaquePointer) -> FramingScan {
    var scan = FramingScan()
    _ = withUnsafeMutablePointer(to: &scan) { pointer in
        fpt_get_head_records(connection, mhdFramingIterator, pointer)
    }
    scan.headBytes = fpt_request_header_size(connection)
    return scan
}

/// The answer to a request whose target `mhdURILog` marked: 414, 400 (`%00`) or 404 (`%2F`).
func targetRefusal(_ marker: UnsafeMutableRawPointer?, path: String, limit: Int) -> HTTPResponse? {
    switch marker {
    case SlotMarker.uriTooLong:
        Responder.uriTooLong(limit: limit)
    case SlotMarker.encodedNUL:
        .error(400, ServiceError("invalid_request", "the request target's path holds %00, a NUL byte"))
    case SlotMarker.encodedSlash:
        .error(404, ServiceError("not_found", "no route for a path with an encoded slash (%2F)"))
    case SlotMarker.malformedTarget:
        RequestFraming.refusal(
            {
                var facts = RequestFraming.Facts()
                facts.malformedTarget = true
                return facts
            }())
    default:
        nil
    }
}

/// The answer to a request whose body framing is ambiguous (RFC 9112 §6.1, §6.3), which must not
/// be carried out lest the rest of the connection be read as another request (request smuggling):
/// more than one `Content-Length` (libmicrohttpd reads the first), both `Transfer-Encoding` and
/// `Content-Length` (400), or a transfer coding other than `chunked` (501). Sent at once, so that
/// libmicrohttpd closes the connection.
///
/// Also, first: a head over `budget` (431; `RequestHeadBudget`: the answer's header block would
/// not fit beside it in the connection's pool, so the request would be carried out and get no
/// answer at all); a header field name that is empty or holds whitespace (400; RFC 9112 §5.1; it
/// may be a different field to a proxy in front); an HTTP/1.1 request without exactly one `Host`
/// field (RFC 9112 §3.2: 400; libmicrohttpd's own check, `MHD_OPTION_STRICT_FOR_CLIENT`, sends its
/// error page's header block twice in 0.9.75).
func framingRefusal(
    _ connection: OpaquePointer, scan: FramingScan, method: UnsafePointer<CChar>,
    url: UnsafePointer<CChar>, version: UnsafePointer<CChar>?, budget: RequestHeadBudget
) -> HTTPResponse? {
    let counts = scan.counts
    if !budget.admits(headBytes: scan.headBytes, records: counts.records, cookieValueBytes: counts.cookieValueBytes) {
        return .error(
            431,
            ServiceError(
                "header_fields_too_large",
                "the request line and header fields are over \(budget.maxHeaderBytes) bytes"
                    + " (each field, query argument and cookie counting 48 more)"))
    }
    // libmicrohttpd parses in place: the method, the target and the version (and the first field's
    // name) lie in its read buffer as they were sent, so the gaps between them are the spaces and
    // line end that it skipped (RequestFraming).
    var facts = RequestFraming.Facts()
    facts.malformedRequestLine = !RequestFraming.requestLineIsWellFormed(
        methodLength: strlen(method), bytesBeforeTarget: method.distance(to: url),
        bytesAfterVersion: version.flatMap { version in
            scan.firstName.map { (version + strlen(version)).distance(to: $0) }
        })
    facts.bareCR = counts.bareCR
    facts.isHTTP10 = version.map { strcmp($0, "HTTP/1.0") == 0 } ?? false
    facts.transferEncodings = counts.transferEncoding
    facts.unmetExpectations = counts.unmetExpectations
    if let refusal = RequestFraming.refusal(facts) { return refusal }
    if counts.malformedNames > 0 {
        return .error(400, ServiceError("invalid_request", "a header field name is empty or holds whitespace"))
    }
    if counts.host != 1, let version, strcmp(version, "HTTP/1.1") == 0 {
        return .error(400, ServiceError("invalid_request", "an HTTP/1.1 request needs exactly one Host field"))
    }
    if counts.contentLength > 1 {
        return .error(400, ServiceError("invalid_request", "more than one Content-Length field"))
    }
    if counts.authorization > 1 {
        return .error(400, ServiceError("invalid_request", "more than one Authorization field"))
    }
    // libmicrohttpd answers a non-numeric Content-Length itself, but takes an empty one (as an
    // obs-fold "Content-Length:\r\n 62" arrives) as no body at all: the body would then be read
    // as the next request.
    if counts.contentLength == 1, let value = header(connection, "Content-Length"),
        !value.utf8.contains(where: { $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") })
    {
        return .error(400, ServiceError("invalid_request", "the Content-Length field has no number"))
    }
    guard counts.transferEncoding > 0 else { return nil }
    if counts.contentLength > 0 {
        return .error(400, ServiceError("invalid_request", "both Transfer-Encoding and Content-Length"))
    }
    // Exactly "chunked", as libmicrohttpd matches it: with a trailing space it would not take the
    // body as chunked, and the connection would wait for a body it never reads.
    if counts.transferEncoding > 1 || header(connection, "Transfer-Encoding")?.lowercased() != "chunked" {
        return .error(501, ServiceError("not_implemented", "the only transfer coding accepted is chunked"))
    }
    return nil
}

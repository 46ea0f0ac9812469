import CMicroHTTPD
import ForgePushToken
import HTTPServing

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

// The framing checks of a request's head, as the engine reads it from libmicrohttpd: one pass
// over its records (`scanFraming`), whose facts `RequestFraming` and `RequestHeadBudget`
// (HTTPServing) decide on as plain values, and the answers to targets that `mhdURILog`
// marked.

/// What one pass over a request's records found: the counts (`RequestFraming.FieldCounts`), where
/// the first header field's name lies in libmicrohttpd's read buffer, the head's size, and the
/// header fields that are not where libmicrohttpd leaves a field it parsed in place.
///
/// libmicrohttpd 0.9.75 parses the head in place (src/microhttpd/connection.c): each line's end
/// becomes NULs, the colon a NUL, and each field's name and value stay where they were sent, one
/// after the other from the method to the end of the blank line. So between one field's value and
/// the next field's name lie only the NULs of a line end (`RequestFraming.isLineEnd`); a folded
/// line (obs-fold) or the rest of a value after a NUL byte lies there too, and a folded field's
/// name is moved out of the head altogether (`process_broken_line` appends the folded line to it
/// in a new block of the pool).
struct FramingScan {
    /// The names whose first value the pass keeps (the daemon's, which outlives every scan: a
    /// scan lives within one call of the access handler).
    unowned(unsafe) let capture: HeadFieldCapture
    /// Their first values.
    var fields = CapturedFields()
    var counts = RequestFraming.FieldCounts()
    /// The first header field's name as it lies in libmicrohttpd's read buffer (`nil` without
    /// one): where the line after the request line starts.
    var firstName: UnsafePointer<CChar>?
    /// `MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE`: the head's bytes as sent, from the method to the
    /// end of the blank line.
    var headBytes = 0
    /// The head in libmicrohttpd's read buffer: from the method, `headBytes` long (`nil` when its
    /// size is unknown: nothing is then checked).
    var head: UnsafeBufferPointer<CChar>?
    /// The end of the last header field's value seen, in the head.
    var previousEnd: UnsafePointer<CChar>?
    /// Header fields folded or holding a NUL byte (`RequestFraming.Facts.foldedOrNUL`).
    var foldedOrNUL = 0

    init(capture: HeadFieldCapture) {
        self.capture = capture
    }

    /// Keeps the value of a header field or query argument whose name `capture` holds.
    mutating func keep(name: UnsafePointer<CChar>, count: Int, value: UnsafePointer<CChar>?, isArgument: Bool) {
        if let slot = capture.slot(of: name, count: count, isArgument: isArgument) { fields.keep(value, in: slot) }
    }

    /// Notes where a header field's `name` and `value` (`valueCount` bytes, as libmicrohttpd
    /// counts them: up to the first NUL) lie: the name must follow the previous field's value
    /// after a bare line end, inside the head.
    mutating func place(name: UnsafePointer<CChar>, value: UnsafePointer<CChar>?, valueCount: Int) {
        guard let head, let start = head.baseAddress else { return }
        let end = start + head.count
        if name < (previousEnd ?? start) || name >= end {
            foldedOrNUL += 1  // moved out of the head: a folded field
        } else if let previousEnd,
            !RequestFraming.isLineEnd(
                UnsafeRawBufferPointer(start: previousEnd, count: previousEnd.distance(to: name)), blankLine: false)
        {
            foldedOrNUL += 1  // a folded line or the rest of a value after a NUL before it
        }
        if let value, value >= start, value + valueCount <= end {
            previousEnd = value + valueCount
        } else {
            foldedOrNUL += 1
            previousEnd = nil
        }
    }

    /// After the last field: the head must end with its line end and the blank line.
    mutating func finish() {
        guard let head, let start = head.baseAddress, let previousEnd else { return }
        let tail = UnsafeRawBufferPointer(start: previousEnd, count: previousEnd.distance(to: start + head.count))
        if !RequestFraming.isLineEnd(tail, blankLine: true) { foldedOrNUL += 1 }
    }
}

/// Reads `connection`'s header fields, query arguments and cookies in one pass
/// (`MHD_get_connection_values_n` with `mhdFramingIterator`, through `fpt_get_head_records`), the
/// head's size, where each header field lies in the head, which starts at `method`, and the first
/// value of each name `capture` holds. Allocates nothing.
func scanFraming(_ connection: OpaquePointer, method: UnsafePointer<CChar>, capture: HeadFieldCapture) -> FramingScan {
    var scan = FramingScan(capture: capture)
    scan.headBytes = fpt_request_header_size(connection)
    if scan.headBytes > 0 { scan.head = UnsafeBufferPointer(start: method, count: scan.headBytes) }
    _ = withUnsafeMutablePointer(to: &scan) { pointer in
        fpt_get_head_records(connection, mhdFramingIterator, pointer)
    }
    scan.finish()
    return scan
}

/// The answer to a request whose target `mhdURILog` found `flaw` in: 414, 400 (`%00`, a space or
/// control character) or 404 (`%2F`). Never `nil` in fact (`RequestFraming.refusal` refuses a
/// malformed target); optional because that function's answer is.
func targetRefusal(_ flaw: TargetFlaw, limit: Int) -> HTTPResponse? {
    switch flaw {
    case .tooLong:
        EngineAnswers.uriTooLong(limit: limit)
    case .encodedNUL:
        EngineAnswers.encodedNUL
    case .encodedSlash:
        EngineAnswers.encodedSlash
    case .malformed:
        RequestFraming.refusal(
            {
                var facts = RequestFraming.Facts()
                facts.malformedTarget = true
                return facts
            }())
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
    facts.foldedOrNUL = scan.foldedOrNUL
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
    if counts.contentLength == 1,
        let value = scan.fields.value(scan.capture.contentLength, name: "Content-Length", on: connection),
        !UnsafeRawBufferPointer(start: value, count: strlen(value)).contains(where: {
            $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9")
        })
    {
        return .error(400, ServiceError("invalid_request", "the Content-Length field has no number"))
    }
    guard counts.transferEncoding > 0 else { return nil }
    if counts.contentLength > 0 {
        return .error(400, ServiceError("invalid_request", "both Transfer-Encoding and Content-Length"))
    }
    // Exactly "chunked", as libmicrohttpd matches it: with a trailing space it would not take the
    // body as chunked, and the connection would wait for a body it never reads.
    if counts.transferEncoding > 1
        || scan.fields.string(scan.capture.transferEncoding, name: "Transfer-Encoding", on: connection)?
            .lowercased() != "chunked"
    {
        return .error(501, ServiceError("not_implemented", "the only transfer coding accepted is chunked"))
    }
    return nil
}

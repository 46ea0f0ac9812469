import ServerSupport

/// Checks of a request's line and header fields that libmicrohttpd 0.9.75 lets through though RFC
/// 9112 says otherwise, and which a permissive proxy in front could turn into request smuggling
/// (issue 21 §5). The engine reads the facts from what libmicrohttpd exposes (the raw request
/// target, the method, target and version as they lie in its read buffer, the header fields);
/// the decisions are here, on plain values.
///
/// A stateless namespace; thread-safe.
public enum RequestFraming {
    /// Whether `byte` may appear in a request-target as sent: not a space, tab, CR, LF or other
    /// control character (RFC 9112 §3.2, RFC 3986 §2). libmicrohttpd takes a target ending in a
    /// space (`GET /token  HTTP/1.1` is a request for `/token `).
    public static func isAllowedInTarget(_ byte: UInt8) -> Bool {
        byte > 0x20 && byte != 0x7F
    }

    /// Whether a request line is method, one space, target, one space, version, and its end
    /// (RFC 9112 §3). libmicrohttpd skips any number of spaces before the target and after the
    /// version, so the engine measures them in its read buffer:
    /// - `bytesBeforeTarget`: from the method's start to the target's, which must be the method's
    ///   length plus one;
    /// - `bytesAfterVersion`: from the version's end to the first header field's name, `nil`
    ///   without header fields; 2 for CRLF, or 1 for a bare LF, which RFC 9112 §2.2 lets a
    ///   recipient accept.
    public static func requestLineIsWellFormed(methodLength: Int, bytesBeforeTarget: Int, bytesAfterVersion: Int?)
        -> Bool
    {
        guard bytesBeforeTarget == methodLength + 1 else { return false }
        guard let bytesAfterVersion else { return true }
        return bytesAfterVersion == 1 || bytesAfterVersion == 2
    }

    /// Whether `gap` is only the line end(s) that libmicrohttpd 0.9.75 left between two header
    /// fields as it parsed them in place: each CRLF or bare LF replaced by as many NUL bytes.
    /// Between the end of one field's value and the next field's name (`blankLine` false) that is
    /// 1 or 2 NULs; between the last field's value and the end of the head (`blankLine` true), its
    /// line end and the blank line, 2 to 4. Anything else is a line that libmicrohttpd folded
    /// into the field before (obs-fold: a line starting with a space or tab, RFC 9112 §5.2), or
    /// the rest of a value after a NUL byte (RFC 9110 §5.5), where libmicrohttpd cut it.
    public static func isLineEnd(_ gap: UnsafeRawBufferPointer, blankLine: Bool) -> Bool {
        let counts = blankLine ? 2...4 : 1...2
        return counts.contains(gap.count) && !gap.contains(where: { $0 != 0 })
    }

    /// What libmicrohttpd saw of a request's framing, for `refusal(_:)`.
    public struct Facts: Sendable, Equatable {
        /// The raw request-target holds a space or control character (`isAllowedInTarget`).
        public var malformedTarget = false
        /// The request line is not exactly method SP target SP version (`requestLineIsWellFormed`).
        public var malformedRequestLine = false
        /// Header fields whose name or value holds a bare CR.
        public var bareCR = 0
        /// Header fields folded over more than one line (obs-fold), or holding a NUL byte: fields
        /// not followed by a bare line end (`isLineEnd`), or whose name libmicrohttpd moved out
        /// of its read buffer (it appends a folded line to the name, in a new place).
        public var foldedOrNUL = 0
        /// The request is HTTP/1.0.
        public var isHTTP10 = false
        /// `Transfer-Encoding` fields.
        public var transferEncodings = 0
        /// `Expect` fields asking for anything but `100-continue`.
        public var unmetExpectations = 0

        /// No finding: a well-framed request.
        public init() {}
    }

    /// `Connection: close`, made once: `refusal(_:)` runs for every request, and a literal there
    /// allocated on every one (the cached read's path must not).
    private static let closing: HTTPHeaders = ["Connection": "close"]

    /// The answer to a request whose framing `facts` refuse, or `nil`. Each refusal carries
    /// `Connection: close`: after a framing error the rest of the connection cannot be trusted to
    /// be the next request.
    /// - a header field folded over more than one line, or holding a NUL byte: `400` (RFC 9112
    ///   §5.2: "A server that receives an obs-fold in a request message ... MUST either reject the
    ///   message by sending a 400 (Bad Request)" or replace it; RFC 9110 §5.5 for NUL).
    ///   libmicrohttpd appends a folded line to the field's *name*, so `Content-Length:` then
    ///   ` 62` was no `Content-Length` at all, and the body was read as the next request;
    /// - a space or control character in the target, or a request line with more than one space
    ///   between its parts: `400` (RFC 9112 §3, §3.2; libmicrohttpd would serve `/token `);
    /// - a bare CR in a header field: `400` (RFC 9112 §2.2: "a recipient of such a bare CR MUST
    ///   consider that element to be invalid or replace each bare CR with SP"; a proxy that ends
    ///   lines at a bare CR would see another field, such as a `Content-Length`);
    /// - `Transfer-Encoding` in an HTTP/1.0 request: `400` (RFC 9112 §6.1: "MUST treat the message
    ///   as if the framing is faulty ... and close the connection");
    /// - an expectation other than `100-continue`: `417` (RFC 9110 §10.1.1).
    public static func refusal(_ facts: Facts) -> HTTPResponse? {
        let close = closing
        if facts.foldedOrNUL > 0 {
            return .error(
                400,
                ServiceError(
                    "invalid_request",
                    "a header field continues on the next line (obs-fold, RFC 9112 §5.2) or holds a NUL byte"),
                headers: close)
        }
        if facts.malformedTarget || facts.malformedRequestLine {
            return .error(
                400,
                ServiceError(
                    "invalid_request",
                    "the request line must be a method, one space, a target without spaces or control characters,"
                        + " one space and the version (RFC 9112 §3)"), headers: close)
        }
        if facts.bareCR > 0 {
            return .error(
                400, ServiceError("invalid_request", "a header field holds a bare CR (RFC 9112 §2.2)"), headers: close)
        }
        if facts.isHTTP10 && facts.transferEncodings > 0 {
            return .error(
                400,
                ServiceError("invalid_request", "Transfer-Encoding in an HTTP/1.0 request (RFC 9112 §6.1)"),
                headers: close)
        }
        if facts.unmetExpectations > 0 {
            return .error(
                417,
                ServiceError("expectation_failed", "the only expectation this service meets is 100-continue"),
                headers: close)
        }
        return nil
    }

    /// What one pass over a request's records (header fields, query arguments, cookies) finds that
    /// the framing checks need; the engine feeds it each record as libmicrohttpd lists them
    /// (`MHD_get_connection_values_n`, which, unlike `MHD_lookup_connection_value`, sees every
    /// field of a repeated name: a repeated one must be seen to be refused, RFC 9112 §3.2, §6.3).
    /// A raw NUL in a value cannot be seen: libmicrohttpd has already cut the value there.
    ///
    /// A value type; `Sendable`. Counting allocates nothing.
    public struct FieldCounts: Sendable, Equatable {
        /// `Host` fields.
        public var host = 0
        /// `Content-Length` fields.
        public var contentLength = 0
        /// `Transfer-Encoding` fields.
        public var transferEncoding = 0
        /// `Authorization` fields.
        public var authorization = 0
        /// Fields whose name is empty or holds a space, tab or NUL: `Content-Length : 4` is not a
        /// `Content-Length` field to libmicrohttpd, but may be one to a proxy in front (RFC 9112
        /// §5.1).
        public var malformedNames = 0
        /// libmicrohttpd's records of the head: one per header field, query argument and cookie
        /// (`RequestHeadBudget`).
        public var records = 0
        /// The length of the first `Cookie` field's value (which libmicrohttpd copies into the
        /// connection's pool to parse it), or `nil` without one.
        public var cookieValueBytes: Int?
        /// Fields whose name or value holds a bare CR (libmicrohttpd ends lines at CRLF or LF only,
        /// so `Host: x\rContent-Length: 43` is one `Host` field to it; RFC 9112 §2.2).
        public var bareCR = 0
        /// `Expect` fields asking for anything but `100-continue` (RFC 9110 §10.1.1).
        public var unmetExpectations = 0
        /// `Expect: 100-continue` fields: libmicrohttpd answers them with `100 Continue` before the
        /// body, even when there is none (`RequestStateMachine.head`).
        public var continueExpectations = 0

        /// Nothing counted yet.
        public init() {}

        /// Counts a record that is not a header field (a query argument or a cookie).
        public mutating func countRecord() {
            records += 1
        }

        /// Counts a header field: `name` as libmicrohttpd holds it (its full length, NULs
        /// included), `value` likewise, or `nil` for a field without one.
        public mutating func countHeader(name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer?) {
            records += 1
            let cr = UInt8(ascii: "\r")
            // One pass over the name for both of its checks (this runs for every field of every
            // request), with the flags as bits rather than `||`, so that the loop has no branch.
            var nameHasCR: UInt8 = 0
            var nameMalformed: UInt8 = name.isEmpty ? 1 : 0
            for byte in name {
                nameHasCR |= byte == cr ? 1 : 0
                nameMalformed |= byte == 0 || byte == UInt8(ascii: " ") || byte == UInt8(ascii: "\t") ? 1 : 0
            }
            if nameHasCR != 0 || value?.contains(cr) == true { bareCR += 1 }
            if nameMalformed != 0 { malformedNames += 1 }
            if Self.named(name, "Host") {
                host += 1
            } else if Self.named(name, "Content-Length") {
                contentLength += 1
            } else if Self.named(name, "Transfer-Encoding") {
                transferEncoding += 1
            } else if Self.named(name, "Authorization") {
                authorization += 1
            } else if Self.named(name, "Expect") {
                if value.map(Self.is100Continue) == true { continueExpectations += 1 } else { unmetExpectations += 1 }
            } else if cookieValueBytes == nil, Self.named(name, "Cookie") {
                cookieValueBytes = value?.count ?? 0
            }
        }

        /// Whether `name` is `literal`, ASCII case-insensitively (RFC 9110 §5.1).
        static func named(_ name: UnsafeRawBufferPointer, _ literal: StaticString) -> Bool {
            guard name.count == literal.utf8CodeUnitCount else { return false }
            let expected = literal.utf8Start
            for index in 0..<name.count where asciiLower(name[index]) != asciiLower(expected[index]) {
                return false
            }
            return true
        }

        /// Whether `value` is `100-continue`, ASCII case-insensitively, with optional spaces and
        /// tabs around it.
        static func is100Continue(_ value: UnsafeRawBufferPointer) -> Bool {
            let blank: (UInt8) -> Bool = { $0 == UInt8(ascii: " ") || $0 == UInt8(ascii: "\t") }
            guard let first = value.firstIndex(where: { !blank($0) }),
                let last = value.lastIndex(where: { !blank($0) })
            else { return false }
            return named(UnsafeRawBufferPointer(rebasing: value[first...last]), "100-continue")
        }
    }
}

import ServerSupport

/// How much of libmicrohttpd's per-connection memory pool a request head may take so that every
/// answer the service can give still fits beside it (issue 21 §2): `--max-header-bytes`.
///
/// libmicrohttpd 0.9.75 (Debian 12) keeps a request's line and header fields, its own record of
/// each field, query argument and cookie, a copy of the `Cookie` field, and then the answer's
/// header block in one pool per connection (`MHD_OPTION_CONNECTION_MEMORY_LIMIT`). When the answer's
/// header block does not fit in what is left, it closes the connection without an answer after the
/// request was carried out ("failed to create response header"). It does not say how much is left,
/// so the service measures the head in the first access-handler call, before anything is carried
/// out, and answers `431` itself when the head is over this budget. The budget is derived from how
/// libmicrohttpd 0.9.75 uses the pool (src/microhttpd/connection.c, memorypool.c):
///
/// - The read buffer starts at half the pool (`try_grow_read_buffer`, and `MHD_pool_reset` between
///   two requests) and only grows while a head is incomplete and the buffer is full, by 128 bytes
///   at a time (`MHD_BUF_INC_SIZE / 8`, as long as an eighth of the free space is under 1 KiB: true
///   for every pool up to `maximumPoolBytes`). Before the answer it is shrunk to the bytes still
///   unread (`connection_shrink_read_buffer`), but the head's bytes, parsed in place, stay. So the
///   read buffer ends at most at half the pool, or at most `growthSlack` bytes past the head.
/// - Every field, query argument and cookie costs a `struct MHD_HTTP_Header` (`recordBytes`) taken
///   from the pool's end, and the first `Cookie` field is copied there whole (`parse_cookie_header`).
/// - The answer's header block takes what is left (`connection_maximize_write_buffer`); the
///   service's largest is under `answerReserve` (status line, `Date`, `Content-Length`,
///   `Connection`, the `Content-Type`, cache and CORS fields with an origin of up to 267 bytes), and
///   an event stream's chunks need 128 bytes of it.
///
/// A head is admitted when (1) its bytes plus its records fit in `maxHeaderBytes`, which is the
/// pool less `answerReserve` and `growthSlack`, and (2) its records alone fit in half the pool less
/// `answerReserve` (the read buffer may hold half the pool of pipelined bytes). Then the answer
/// fits in both cases: a read buffer that never grew, and one that grew with the head.
///
/// Not covered (docs/http-api.md): blank lines before the request line (libmicrohttpd skips them
/// without saying how many) and a chunked body whose chunk-size line or trailer fields make
/// libmicrohttpd grow its read buffer.
///
/// A value type; thread-safe.
public struct RequestHeadBudget: Sendable, Equatable {
    /// Bytes of one `struct MHD_HTTP_Header` on a 64-bit system (two pointers to the list, name and
    /// value pointers and lengths, the kind; libmicrohttpd 0.9.75 src/microhttpd/internal.h).
    public static let recordBytes = 48
    /// The pool's allocation granularity (`ALIGN_SIZE`, two pointers; memorypool.c).
    public static let alignment = 16
    /// Bytes kept for the answer's header block.
    public static let answerReserve = 1024
    /// Bytes the read buffer may end past the head: one 128-byte growth step and the alignment of
    /// the read and the write buffer.
    public static let growthSlack = 128 + 2 * alignment
    /// The largest pool for which growth is in 128-byte steps: its free half is under 8 KiB, so an
    /// eighth of it is under `MHD_BUF_INC_SIZE` (1 KiB).
    public static let maximumPoolBytes = 16384 - alignment
    /// The accepted values of `--max-header-bytes`: from 2,048 up to what a `maximumPoolBytes` pool
    /// allows.
    public static let maxHeaderBytesRange = 2048...(maximumPoolBytes - answerReserve - growthSlack)
    /// The default: the budget of an 8 KiB pool (the memory per connection, and so per subscriber,
    /// of earlier releases), 7,008 bytes.
    public static let defaultMaxHeaderBytes = 8192 - answerReserve - growthSlack

    /// The most bytes of a request head (its line, fields and blank line as sent, plus
    /// `recordBytes` per field, query argument and cookie, plus the `Cookie` field's copy).
    public let maxHeaderBytes: Int

    /// A budget of `maxHeaderBytes`, which must be within `maxHeaderBytesRange` (clamped otherwise).
    public init(maxHeaderBytes: Int = RequestHeadBudget.defaultMaxHeaderBytes) {
        let range = Self.maxHeaderBytesRange
        self.maxHeaderBytes = min(max(maxHeaderBytes, range.lowerBound), range.upperBound)
    }

    /// The connection memory pool this budget needs, in bytes (8192 for the default budget).
    public var poolBytes: Int { maxHeaderBytes + Self.answerReserve + Self.growthSlack }

    /// The most bytes of libmicrohttpd's records (and the `Cookie` copy) a head may cost.
    public var maxRecordBytes: Int { poolBytes / 2 - Self.answerReserve - Self.alignment }

    /// What a head costs in the pool beyond its own bytes: `records` records and, when a `Cookie`
    /// field came, the copy of the first one's `cookieValueBytes` (with its NUL, aligned).
    public static func recordBytes(records: Int, cookieValueBytes: Int?) -> Int {
        let copy = cookieValueBytes.map { ($0 + 1 + alignment - 1) / alignment * alignment } ?? 0
        return records * recordBytes + copy
    }

    /// Whether a head of `headBytes` (libmicrohttpd's `MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE`:
    /// from the method to the end of the blank line) with `records` fields, query arguments and
    /// cookies, and a first `Cookie` value of `cookieValueBytes`, leaves room for every answer.
    public func admits(headBytes: Int, records: Int, cookieValueBytes: Int?) -> Bool {
        let extra = Self.recordBytes(records: records, cookieValueBytes: cookieValueBytes)
        return extra <= maxRecordBytes && headBytes + extra <= maxHeaderBytes
    }
}

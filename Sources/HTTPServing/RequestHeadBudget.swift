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
///   two requests) and only grows while a head is incomplete. It grows by an eighth of the pool's
///   free space when that is at least `MHD_BUF_INC_SIZE` (1 KiB), before any read that would find
///   fewer than 1 KiB free in the buffer (`MHD_connection_handle_read`), and otherwise by 128 bytes
///   (`MHD_BUF_INC_SIZE / 8`) when the buffer is full (`MHD_connection_handle_idle`). Before the
///   answer it is shrunk to the bytes still unread (`connection_shrink_read_buffer`), but the
///   head's bytes, parsed in place, stay. So the read buffer ends at most at half the pool, or, if
///   it grew, past the head by less than its last step and, for a large step, the 1 KiB that
///   may have been free in the buffer before it. The free space is at most half the pool after the
///   first half was taken, so a large step is at most a sixteenth of the pool, and a pool under
///   16 KiB never has one (`smallStepPoolBytes`): the read buffer ends at most `growthSlack` past
///   the head below it and `largeGrowthSlack(poolBytes:)` past it from there.
/// - Every field, query argument and cookie costs a `struct MHD_HTTP_Header` (`recordBytes`) taken
///   from the pool's end, and the first `Cookie` field is copied there whole (`parse_cookie_header`).
/// - The answer's header block takes what is left (`connection_maximize_write_buffer`); the
///   service's largest is under `answerReserve` (status line, `Date`, `Content-Length`,
///   `Connection`, the `Content-Type`, cache and CORS fields with an origin of up to 267 bytes), and
///   an event stream's chunks need 128 bytes of it.
///
/// A head is admitted when (1) its bytes plus its records fit in `maxHeaderBytes`, which is the
/// pool less `answerReserve` and the growth slack (`maxHeaderBytes(poolBytes:)`), and (2) its
/// records alone fit in half the pool less `answerReserve` (the read buffer may hold half the pool
/// of pipelined bytes). Then the answer
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
    /// libmicrohttpd's `MHD_BUF_INC_SIZE` (1 KiB; also `MHD_OPTION_CONNECTION_MEMORY_INCREMENT`'s
    /// default, which the service keeps): a read buffer with fewer bytes free grows before a read.
    public static let bufferIncrement = 1024
    /// Bytes the read buffer may end past the head in a pool of under `smallStepPoolBytes`: one
    /// 128-byte growth step and the alignment of the read and the write buffer.
    public static let growthSlack = bufferIncrement / 8 + 2 * alignment
    /// The largest pool in which the read buffer grows only by 128-byte steps: its free half is
    /// under 8 KiB, so an eighth of it is under `bufferIncrement`.
    public static let smallStepPoolBytes = 16384 - alignment
    /// The largest pool the service asks for: 64 KiB.
    public static let maximumPoolBytes = 65536
    /// Bytes the read buffer may end past the head in a pool of `poolBytes` at or over 16 KiB: a
    /// large step (at most a sixteenth of the pool), the `bufferIncrement` that may have been free
    /// in the buffer before it, and the alignment of the read and the write buffer.
    public static func largeGrowthSlack(poolBytes: Int) -> Int {
        poolBytes / 16 + bufferIncrement + 2 * alignment
    }
    /// The largest head budget a pool of `poolBytes` (a multiple of `alignment`) keeps the answer's
    /// reserve for: the pool less `answerReserve` and the read buffer's growth slack.
    public static func maxHeaderBytes(poolBytes: Int) -> Int {
        let slack = poolBytes <= smallStepPoolBytes ? growthSlack : largeGrowthSlack(poolBytes: poolBytes)
        return poolBytes - answerReserve - slack
    }
    /// The accepted values of `--max-header-bytes`: from 2,048 up to what a `maximumPoolBytes` pool
    /// allows (59,360).
    public static let maxHeaderBytesRange = 2048...maxHeaderBytes(poolBytes: maximumPoolBytes)
    /// The default: the budget of a 40 KiB pool, 36,320 bytes. It admits a browser's
    /// `EventSource` request carrying a `Cookie` field of 8 KiB in up to 216 pairs (38 bytes or
    /// more each) beside 17 ordinary fields and a query argument, an 8,940-byte head
    /// (Tests/TokenServiceTests/RequestHeadBudgetTests.swift): its records, not its bytes, are what
    /// limit it (`maxRecordBytes`, 19,440 bytes: 8,208 for the copy, 48 for each record).
    public static let defaultMaxHeaderBytes = maxHeaderBytes(poolBytes: 40960)

    /// The most bytes of a request head (its line, fields and blank line as sent, plus
    /// `recordBytes` per field, query argument and cookie, plus the `Cookie` field's copy).
    public let maxHeaderBytes: Int

    /// A budget of `maxHeaderBytes`, which must be within `maxHeaderBytesRange` (clamped otherwise).
    public init(maxHeaderBytes: Int = RequestHeadBudget.defaultMaxHeaderBytes) {
        let range = Self.maxHeaderBytesRange
        self.maxHeaderBytes = min(max(maxHeaderBytes, range.lowerBound), range.upperBound)
    }

    /// The smallest connection memory pool, a multiple of `alignment`, whose
    /// `maxHeaderBytes(poolBytes:)` is at least this budget, in bytes (40,960 for the default).
    public var poolBytes: Int {
        let small = maxHeaderBytes + Self.answerReserve + Self.growthSlack
        if small <= Self.smallStepPoolBytes { return small }
        // pool - pool / 16 >= budget + reserve + increment + 2 * alignment, the pool a multiple of 16.
        let needed = maxHeaderBytes + Self.answerReserve + Self.bufferIncrement + 2 * Self.alignment
        return (needed + 14) / 15 * 16
    }

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

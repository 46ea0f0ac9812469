import CMicroHTTPD
import HTTPServing

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

// The header fields and query arguments a request's head is read for, kept in the one pass over
// its records that the framing checks make (`scanFraming`), instead of being looked up one by one
// afterwards: each `MHD_lookup_connection_value` measures the name and walks every record again,
// and a `POST /register` made ten of them.

/// The names one pass over a request's records keeps the first value of (`CapturedFields`): the
/// engine's own (`Content-Length`, `Transfer-Encoding`, `Origin`), the application's header fields
/// (`HTTPApplicationTraits.headerFieldsRead`) and query parameters (`queryParametersRead`), each once,
/// at most `CapturedFields.capacity`; the rest are looked up as before (`CapturedFields.value`).
///
/// Names match as libmicrohttpd 0.9.75's `MHD_lookup_connection_value` matches them
/// (src/microhttpd/connection.c): same length, ASCII case-insensitively, for header fields and
/// query arguments alike, and the first record of the name wins, even one without a value.
///
/// Thread-safety: immutable after `init`; read by every daemon thread. `@unchecked Sendable`
/// because its tables are unsafe buffers (so that reading them retains nothing, on every record of
/// every request): they are written once in `init`, before the instance is shared, never after,
/// and freed only in `deinit`, when no thread can reach it.
final class HeadFieldCapture: @unchecked Sendable {
    /// One name: where its lowercased bytes lie in `bytes`, how many, and whether it names a query
    /// argument.
    private struct Entry {
        let start: Int
        let count: Int
        let isArgument: Bool
    }

    /// Every name's bytes, ASCII-lowercased, one after another.
    private let bytes: UnsafeMutableBufferPointer<UInt8>
    /// Every name's bytes as the application spells it (as clients send it, mostly), at the same
    /// offsets: compared first, with `memcmp`.
    private let spelled: UnsafeMutableBufferPointer<UInt8>
    private let entries: UnsafeMutableBufferPointer<Entry>
    /// Bit `n` set when a name is `n` bytes long (names of 64 bytes or more are not kept): most
    /// records' names are no name's length, and are passed over at once.
    private let lengths: UInt64
    /// The slot of `Content-Length`, `Transfer-Encoding` and `Origin` (the engine's own).
    let contentLength: Int?
    let transferEncoding: Int?
    let origin: Int?
    /// The slot of each of the application's header fields and query parameters, in their order
    /// (`nil` past the capacity).
    let headerSlots: [Int?]
    let parameterSlots: [Int?]

    /// The slots for `headerFields` and `queryParameters` beside the engine's three fields.
    init(headerFields: [String], queryParameters: [String]) {
        var bytes: [UInt8] = []
        var spelled: [UInt8] = []
        var entries: [Entry] = []
        func slot(_ name: String, isArgument: Bool) -> Int? {
            let lowered = name.utf8.map(asciiLower)
            if let found = entries.indices.first(where: { index in
                let entry = entries[index]
                return entry.isArgument == isArgument
                    && bytes[entry.start..<entry.start + entry.count].elementsEqual(lowered)
            }) {
                return found
            }
            guard entries.count < CapturedFields.capacity, lowered.count < 64 else { return nil }
            entries.append(Entry(start: bytes.count, count: lowered.count, isArgument: isArgument))
            bytes += lowered
            spelled += name.utf8
            return entries.count - 1
        }
        contentLength = slot("Content-Length", isArgument: false)
        transferEncoding = slot("Transfer-Encoding", isArgument: false)
        origin = slot("Origin", isArgument: false)
        headerSlots = headerFields.map { slot($0, isArgument: false) }
        parameterSlots = queryParameters.map { slot($0, isArgument: true) }
        self.bytes = .allocate(capacity: bytes.count)
        _ = self.bytes.initialize(from: bytes)
        self.spelled = .allocate(capacity: spelled.count)
        _ = self.spelled.initialize(from: spelled)
        self.entries = .allocate(capacity: entries.count)
        _ = self.entries.initialize(from: entries)
        lengths = entries.reduce(0) { $0 | UInt64(1) << UInt64($1.count) }
    }

    deinit {
        bytes.deallocate()
        spelled.deallocate()
        entries.deallocate()
    }

    /// The slot of the record `name` (`count` bytes: a header field, or a query argument when
    /// `isArgument`), or `nil` when no name kept matches.
    func slot(of name: UnsafePointer<CChar>, count: Int, isArgument: Bool) -> Int? {
        guard count < 64, lengths & (UInt64(1) << UInt64(count)) != 0 else { return nil }
        for index in 0..<entries.count {
            let entry = entries[index]
            guard entry.count == count, entry.isArgument == isArgument else { continue }
            if let spelling = spelled.baseAddress, memcmp(name, spelling + entry.start, count) == 0 { return index }
            var same = true
            for offset in 0..<count where asciiLower(UInt8(bitPattern: name[offset])) != bytes[entry.start + offset] {
                same = false
                break
            }
            if same { return index }
        }
        return nil
    }
}

/// The first value of each name a `HeadFieldCapture` keeps, as one pass over a request's records
/// found it: pointers into libmicrohttpd's copy of the head, valid for the access handler's call.
/// Allocates nothing.
struct CapturedFields {
    /// The most names kept.
    static let capacity = 16

    /// Each slot's first value (`nil` for none, or for a record without a value).
    private var values = InlineArray<16, UnsafePointer<CChar>?>(repeating: nil)
    /// The slots whose name has appeared, one bit each.
    private var seen: UInt16 = 0

    /// Keeps `value` in `slot` unless a record of that name came before.
    mutating func keep(_ value: UnsafePointer<CChar>?, in slot: Int) {
        let bit = UInt16(1) << UInt16(slot)
        guard seen & bit == 0 else { return }
        seen |= bit
        values[slot] = value
    }

    /// The first value kept in `slot` (`nil` when none was, or the first record had none).
    func kept(_ slot: Int) -> UnsafePointer<CChar>? {
        values[slot]
    }

    /// The value of `slot`'s name, or, for a name not kept (`slot` is `nil`), libmicrohttpd's
    /// (`MHD_lookup_connection_value` of `name` and `kind` on `connection`).
    func value(
        _ slot: Int?, name: String, kind: MHD_ValueKind = .HEADER_KIND, on connection: OpaquePointer
    ) -> UnsafePointer<CChar>? {
        if let slot { return values[slot] }
        // `withCString`, not the implicit conversion of a `String` argument: that conversion
        // copies a small string (most field names) to a new heap array on every call.
        return name.withCString { MHD_lookup_connection_value(connection, kind, $0) }
    }

    /// `value(_:name:kind:on:)` as a `String`.
    func string(
        _ slot: Int?, name: String, kind: MHD_ValueKind = .HEADER_KIND, on connection: OpaquePointer
    ) -> String? {
        value(slot, name: name, kind: kind, on: connection).map { String(cString: $0) }
    }
}

import ForgePushToken
import ForgePushTokenOwner

/// The service's token at one version, with the bytes every reader of that version shares: the
/// HTTP layer's `TokenRendition`, which the `TokenOwner` makes once per version it applies.
///
/// `version` is the event id of `GET /token/stream` (docs/http-api.md). The JSON body of
/// `GET /token`, its `ETag` and the SSE event are rendered once per version, not once per request
/// or subscriber, and lazily: by the first reader of any of them, outside the owner's lock. A write
/// that nobody reads before the next one (a burst of `POST /register`) renders nothing.
/// A value type; `Sendable`; copies share one rendering.
public struct TokenSnapshot: TokenRendition, Equatable {
    /// The change counter: 0 at start, +1 per change of `token`.
    public let version: UInt64
    /// The device token as lowercase hex digits (2 per byte), or `nil` when none is registered.
    public let token: String?
    /// The rendering, once its first reader has made it; shared by every copy. A `Locked` (a
    /// `pthread_mutex_t`, an ordering Thread Sanitizer sees: with `AtomicLazyReference` here a
    /// debug build drew a report of the rendering's fields), held only to read or set the
    /// reference, never while rendering.
    private let rendering: Locked<Rendering?>
    /// The rendering itself, in a copy made by `prepared()`: read without the lock. A delivery to
    /// 10,000 subscribers on two threads reads it 10,000 times, and the lock, shared by every
    /// copy, would have them contend.
    private let ready: Rendering?
    /// `ready`'s event, in a copy made by `prepared()`; empty otherwise (an event never is). What a
    /// delivery reads once per subscriber: a plain array, because reading the optional `ready`
    /// went through `Optional`'s generic copy, which cost more than the rest of an offer.
    private let preparedEvent: [UInt8]

    /// The body of `GET /token`: `{"token":"<hex>"}` or `{"token":null}`, UTF-8 JSON.
    public var tokenBody: [UInt8] { rendered.tokenBody }
    /// The SSE event for this version: `id: <version>`, `event: token`,
    /// `data: {"token":…}`, empty line.
    public var event: [UInt8] { preparedEvent.isEmpty ? rendered.event : preparedEvent }
    /// The `ETag` of `tokenBody` (`EntityTag.strong(digesting:)`): it follows from the token's value
    /// alone, so it stays right across restarts and version resets.
    public var entityTag: EntityTag { rendered.entityTag }

    /// The rendering, made now (outside the lock) if no reader has made it yet; readers that race
    /// each make one, the first stored wins and every reader returns that one.
    private var rendered: Rendering {
        if let ready { return ready }
        if let rendered = rendering.withLock({ $0 }) { return rendered }
        let fresh = Rendering(version: version, token: token)
        return rendering.withLock { stored in
            if let first = stored { return first }
            stored = fresh
            return fresh
        }
    }

    /// The snapshot of `state` (nothing is rendered yet).
    public init(_ state: TokenState) {
        self.init(version: state.version, token: state.token)
    }

    /// The version and token this snapshot renders.
    public var state: TokenState { TokenState(version: version, token: token) }

    /// The snapshot of `token` at `version` (nothing is rendered yet).
    public init(version: UInt64, token: String?) {
        self.version = version
        self.token = token
        self.rendering = Locked(nil)
        self.ready = nil
        self.preparedEvent = []
    }

    private init(version: UInt64, token: String?, rendering: Locked<Rendering?>, ready: Rendering) {
        self.version = version
        self.token = token
        self.rendering = rendering
        self.ready = ready
        self.preparedEvent = ready.event
    }

    /// This snapshot with its rendering made (now, if no reader has made it yet) and held by the
    /// copy itself, so that its readers take no lock (`TokenRendition.prepared()`: the owner
    /// calls it once per delivery, outside its lock). Equal to `self`; shares its rendering.
    public func prepared() -> TokenSnapshot {
        if ready != nil { return self }
        return TokenSnapshot(version: version, token: token, rendering: rendering, ready: rendered)
    }

    /// The body of `POST /register` and `POST /fail` for `state`:
    /// `{"changed":true|false,"token":"<hex>"|null}` (keys sorted, as every JSON body here).
    public static func changeBody(_ state: TokenState, changed: Bool) -> [UInt8] {
        let token = state.token
        var body: [UInt8] = []
        body.reserveCapacity(28 + (token?.utf8.count ?? 4))
        body.append(contentsOf: (changed ? #"{"changed":true,"token":"# : #"{"changed":false,"token":"#).utf8)
        JSONText.append(token, to: &body)
        body.append(UInt8(ascii: "}"))
        return body
    }

    /// Equal when version and token are (the rendered bytes follow from them).
    public static func == (lhs: TokenSnapshot, rhs: TokenSnapshot) -> Bool {
        lhs.version == rhs.version && lhs.token == rhs.token
    }
}

/// The bytes of one `TokenSnapshot`, made by its first reader and shared by every copy after.
/// Immutable; `Sendable`.
final class Rendering: Sendable {
    /// `TokenSnapshot.tokenBody`.
    let tokenBody: [UInt8]
    /// `TokenSnapshot.event`.
    let event: [UInt8]
    /// `TokenSnapshot.entityTag`.
    let entityTag: EntityTag

    /// Renders `token` at `version`: the body, its tag and the event.
    init(version: UInt64, token: String?) {
        var body: [UInt8] = []
        body.reserveCapacity(12 + (token?.utf8.count ?? 4))
        body.append(contentsOf: #"{"token":"#.utf8)
        JSONText.append(token, to: &body)
        body.append(UInt8(ascii: "}"))
        self.tokenBody = body
        self.entityTag = EntityTag.strong(digesting: body)
        self.event = ServerSentEvents.event(id: version, name: "token", data: body)
    }
}

/// The service's one JSON string escaper, written by hand for the bodies on the hot paths
/// (`GET /token`, `POST /register`, the SSE event), where `JSONEncoder` cost more than the rest of
/// the request, and used by the JSON log lines too (`JSONLine.string`). For these values the output
/// is the bytes `JSONBody.encode` gives (sorted keys, no escaped slashes).
///
/// RFC 8259 §7: quote, backslash and C0 controls are escaped. U+2028 LINE SEPARATOR and U+2029
/// PARAGRAPH SEPARATOR are valid raw in JSON, but are escaped too (`\u2028`, `\u2029`; the same
/// value to any JSON parser): JavaScript before ES2019 ends a string literal there, and tools that
/// split text on Unicode line breaks (Python's `str.splitlines`, some log shippers) would cut a
/// body, an SSE `data:` line or a log line in two. Thread-safety: stateless.
enum JSONText {
    /// Appends `value` as a JSON string, or `null` for `nil`.
    static func append(_ value: String?, to out: inout [UInt8]) {
        guard let value else {
            out.append(contentsOf: "null".utf8)
            return
        }
        out.append(UInt8(ascii: "\""))
        let utf8 = value.utf8
        // Nothing to escape (hex digits, always, for a token): the bytes are copied as they are,
        // from the string's contiguous storage when it has one (native and small strings: always
        // here) with one `memcpy`, which costs a fraction of appending the view byte by byte.
        let plain: Bool
        if let copied = utf8.withContiguousStorageIfAvailable({ bytes -> Bool in
            guard !anyNeedsEscaping(UnsafeRawBufferPointer(bytes)) else { return false }
            out.append(contentsOf: bytes)
            return true
        }) {
            plain = copied
        } else if !utf8.contains(where: needsEscaping) {
            out.append(contentsOf: utf8)
            plain = true
        } else {
            plain = false
        }
        if plain {
            out.append(UInt8(ascii: "\""))
            return
        }
        var index = utf8.startIndex
        while index != utf8.endIndex {
            let byte = utf8[index]
            utf8.formIndex(after: &index)
            switch byte {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"):
                out.append(UInt8(ascii: "\\"))
                out.append(byte)
            case 0x0A: out.append(contentsOf: #"\n"#.utf8)
            case 0x0D: out.append(contentsOf: #"\r"#.utf8)
            case 0x09: out.append(contentsOf: #"\t"#.utf8)
            case 0x08: out.append(contentsOf: #"\b"#.utf8)
            case 0x0C: out.append(contentsOf: #"\f"#.utf8)
            case 0..<0x20:
                out.append(contentsOf: #"\u00"#.utf8)
                out.append(DeviceTokenHex.digits[Int(byte >> 4)])
                out.append(DeviceTokenHex.digits[Int(byte & 0x0f)])
            case 0xE2:
                // A String's UTF-8 is valid: a lead byte 0xE2 has two continuation bytes.
                let second = utf8[index]
                let third = utf8[utf8.index(after: index)]
                if second == 0x80 && (third == 0xA8 || third == 0xA9) {
                    out.append(contentsOf: (third == 0xA8 ? #"\u2028"# : #"\u2029"#).utf8)
                    utf8.formIndex(&index, offsetBy: 2)
                } else {
                    out.append(byte)
                }
            default:
                out.append(byte)
            }
        }
        out.append(UInt8(ascii: "\""))
    }
}

/// Whether JSON text must escape `byte` in a string (`JSONText.append`): quote, backslash, C0
/// controls, and 0xE2, which leads the UTF-8 of U+2028 and U+2029 (E2 80 A8, E2 80 A9).
@inline(__always)
func needsEscaping(_ byte: UInt8) -> Bool {
    byte < 0x20 || byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") || byte == 0xE2
}

/// Whether any byte of `bytes` `needsEscaping`, eight bytes at a time: the "has a byte less than
/// n" and "has a zero byte" tests of Bit Twiddling Hacks (Sean Eron Anderson, Stanford), exact as
/// answers to "any" for n at most 128, on each 8-byte word, then the tail byte by byte. A 64-digit
/// device token is eight words, where the byte-wise scan took about ten instructions a byte on
/// every `POST /register`.
func anyNeedsEscaping(_ bytes: UnsafeRawBufferPointer) -> Bool {
    let ones: UInt64 = 0x0101_0101_0101_0101
    let highs: UInt64 = 0x8080_8080_8080_8080
    // Each term's high bit is set in a byte that is what it looks for (or above one that is):
    // below 0x20, a quote, a backslash, 0xE2 (a zero byte once XORed with it). One branch a word.
    @inline(__always) func zeroBytes(_ word: UInt64) -> UInt64 { (word &- ones) & ~word }
    var offset = 0
    while offset + 8 <= bytes.count {
        let word = bytes.loadUnaligned(fromByteOffset: offset, as: UInt64.self)
        let found =
            (word &- ones &* 0x20) & ~word | zeroBytes(word ^ (ones &* 0x22))
            | zeroBytes(word ^ (ones &* 0x5C)) | zeroBytes(word ^ (ones &* 0xE2))
        if found & highs != 0 { return true }
        offset += 8
    }
    while offset < bytes.count {
        if needsEscaping(bytes[offset]) { return true }
        offset += 1
    }
    return false
}

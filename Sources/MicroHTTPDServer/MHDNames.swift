import CMicroHTTPD

// libmicrohttpd's values that its header gives as macros Swift does not import, under Swift
// names, and what this engine keeps in libmicrohttpd's context slots: a typed `RequestSlot` per
// request, and one mark per admitted connection.
// The values are those of microhttpd.h (libmicrohttpd 0.9.75); the manual's "microhttpd-cb"
// section describes the callbacks that return or receive them.

/// What a content reader (`MHD_ContentReaderCallback`) may return besides a byte count.
enum ContentReaderResult {
    /// `MHD_CONTENT_READER_END_OF_STREAM`: the body is complete (a chunked body terminates cleanly).
    static let endOfStream = -1
    /// `MHD_CONTENT_READER_END_WITH_ERROR`: the connection is closed without a clean end.
    static let endWithError = -2
}

/// `enum MHD_ConnectionNotificationCode`'s values, as its raw values.
enum ConnectionNotification {
    /// `MHD_CONNECTION_NOTIFY_STARTED`: a connection was accepted.
    static let started: UInt32 = 0
    /// `MHD_CONNECTION_NOTIFY_CLOSED`: a connection is closed.
    static let closed: UInt32 = 1
}

/// `FD_SETSIZE` (glibc): the size of an `fd_set`, which `MHD_get_fdset2` is told.
let fdSetSize: UInt32 = 1024

/// `MHD_SIZE_UNKNOWN`: a response body of unknown size (sent chunked).
let responseSizeUnknown = UInt64.max

/// A request target `mhdURILog` refuses before libmicrohttpd parses it (`targetFlaw`), answered
/// by `targetRefusal` (RequestFramingCheck.swift).
enum TargetFlaw: UInt, CaseIterable {
    /// Over `ServerConfiguration.maxURLBytes`: 414.
    case tooLong
    /// A path holding `%00`, which libmicrohttpd would decode into a NUL that ends the path it
    /// hands over (`/token%00x` would be served as `/token`): 400.
    case encodedNUL
    /// A path holding `%2F`, an encoded slash, which is data and not a separator (RFC 3986 §2.2):
    /// `/token%2Fstream` names no route, though libmicrohttpd would decode it into
    /// `/token/stream`: 404.
    case encodedSlash
    /// A space or control character (`RequestFraming.isAllowedInTarget`): `GET /token  HTTP/1.1`
    /// would be served as `/token `: 400.
    case malformed
}

/// Where a cached read (`HTTPApplicationTraits.cachedReadPath`) stands.
struct CachedReadMark: Equatable {
    /// Whether the request is a `HEAD` (else a `GET`).
    var isHead: Bool
    /// The status queued: 0 until answered, then 200 or 304.
    var status: CachedReadStatus = .unanswered
}

/// The status a cached read was answered with.
enum CachedReadStatus: UInt, CaseIterable {
    /// Not answered yet (or its connection went first).
    case unanswered
    /// `200 OK`.
    case ok
    /// `304 Not Modified`.
    case notModified

    /// The status code (0 when unanswered).
    var code: Int {
        switch self {
        case .unanswered: 0
        case .ok: 200
        case .notModified: 304
        }
    }
}

/// What a request's slot (`*con_cls`) holds, as a typed value: the protocol between `mhdURILog`
/// (which may record a flawed target), the access handler (which records a cached read or a
/// retained `RequestContext`) and the request-completed callback (which takes it). The engine
/// reads and writes the slot only through `init(word:)` and `word`, here.
///
/// libmicrohttpd gives each request one pointer-sized word and never reads it. A context is kept
/// there as its object's address (retained by the slot). The two other cases are kept in the same
/// word without an allocation (the cached read is the commonest request), as a tag in its low four
/// bits, which no object's address has (Swift's heap objects are aligned to 16 bytes), and their
/// payload above it:
///
/// | case           | bits 0-3 | bits 4-…                                  |
/// |----------------|----------|-------------------------------------------|
/// | `empty`        | 0        | 0 (the null pointer)                      |
/// | `context`      | 0        | the object's address                      |
/// | `flawedTarget` | 1        | `TargetFlaw.rawValue`                     |
/// | `cachedRead`   | 2        | bit 4 `isHead`, bits 5-… `status.rawValue` |
///
/// Every case round-trips (RequestSlotTests).
enum RequestSlot {
    /// Nothing yet: the access handler's first call.
    case empty
    /// `mhdURILog` refused the target: the access handler's first call answers it.
    case flawedTarget(TargetFlaw)
    /// A cached read, on the allocation-free path.
    case cachedRead(CachedReadMark)
    /// An ordinary request: its context, retained by the slot.
    case context(RequestContext)

    private static let tagMask: UInt = 0xF
    private static let flawTag: UInt = 1
    private static let cachedReadTag: UInt = 2

    /// Decodes `word`, what the slot holds (a context is not retained again).
    init(word: UnsafeMutableRawPointer?) {
        guard let word else {
            self = .empty
            return
        }
        let bits = UInt(bitPattern: word)
        let payload = bits >> 4
        switch bits & Self.tagMask {
        case 0:
            self = .context(Unmanaged<RequestContext>.fromOpaque(word).takeUnretainedValue())
        case Self.flawTag:
            self = TargetFlaw(rawValue: payload).map { .flawedTarget($0) } ?? .empty
        case Self.cachedReadTag:
            let status = CachedReadStatus(rawValue: payload >> 1) ?? .unanswered
            self = .cachedRead(CachedReadMark(isHead: payload & 1 == 1, status: status))
        default:
            self = .empty  // never written
        }
    }

    /// The word for the slot. A context's is its address, unretained: `store(in:)` retains it.
    var word: UnsafeMutableRawPointer? {
        switch self {
        case .empty:
            return nil
        case .context(let context):
            return Unmanaged.passUnretained(context).toOpaque()
        case .flawedTarget(let flaw):
            return UnsafeMutableRawPointer(bitPattern: flaw.rawValue << 4 | Self.flawTag)
        case .cachedRead(let mark):
            let payload = mark.status.rawValue << 1 | (mark.isHead ? 1 : 0)
            return UnsafeMutableRawPointer(bitPattern: payload << 4 | Self.cachedReadTag)
        }
    }

    /// Writes this value into `slot`, retaining a context for the slot. The slot must not hold a
    /// context already (each request gets at most one).
    func store(in slot: UnsafeMutablePointer<UnsafeMutableRawPointer?>) {
        if case .context(let context) = self {
            let word = Unmanaged.passRetained(context).toOpaque()
            precondition(UInt(bitPattern: word) & Self.tagMask == 0, "a heap object aligned to less than 16 bytes")
            slot.pointee = word
        } else {
            slot.pointee = word
        }
    }

    /// Takes what `slot` holds and empties it; a context's retain passes to the value returned.
    static func take(from slot: UnsafeMutablePointer<UnsafeMutableRawPointer?>) -> RequestSlot {
        let value = RequestSlot(word: slot.pointee)
        if case .context = value, let word = slot.pointee {
            Unmanaged<RequestContext>.fromOpaque(word).release()
        }
        slot.pointee = nil
        return value
    }
}

import CMicroHTTPD

// libmicrohttpd's values that its header gives as macros Swift does not import, and the
// fake-pointer markers this adapter keeps in libmicrohttpd's context slots, under Swift names.
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

/// The fake pointers this adapter stores in libmicrohttpd's per-request slot (`*con_cls`) and
/// per-connection slot (`*socket_context`) instead of an allocation. They are small addresses no
/// allocation can have; they are compared, never dereferenced.
enum SlotMarker {
    /// `*con_cls` of a `GET /token` without a body while the access log is off: the commonest
    /// request allocates nothing.
    static var tokenGet: UnsafeMutableRawPointer { UnsafeMutableRawPointer(bitPattern: 1)! }
    /// `*con_cls` of a `HEAD /token`, likewise.
    static var tokenHead: UnsafeMutableRawPointer { UnsafeMutableRawPointer(bitPattern: 2)! }
    /// `*con_cls` set by `mhdURILog` for a request target over `ServerConfiguration.maxURLBytes`.
    static var uriTooLong: UnsafeMutableRawPointer { UnsafeMutableRawPointer(bitPattern: 3)! }
    /// `*con_cls` set by `mhdURILog` for a path holding `%00`, which libmicrohttpd would decode into
    /// a NUL that ends the path it hands over (`/token%00x` would be served as `/token`).
    static var encodedNUL: UnsafeMutableRawPointer { UnsafeMutableRawPointer(bitPattern: 4)! }
    /// `*con_cls` set by `mhdURILog` for a path holding `%2F`, an encoded slash, which is data and
    /// not a separator (RFC 3986 §2.2): `/token%2Fstream` names no route, though libmicrohttpd
    /// would decode it into `/token/stream`.
    static var encodedSlash: UnsafeMutableRawPointer { UnsafeMutableRawPointer(bitPattern: 5)! }
    /// `*con_cls` set by `mhdURILog` for a target holding a space or control character
    /// (`RequestFraming.isAllowedInTarget`): `GET /token  HTTP/1.1` would be served as `/token `.
    static var malformedTarget: UnsafeMutableRawPointer { UnsafeMutableRawPointer(bitPattern: 8)! }
    /// What `tokenGet` becomes once the request was answered `304 Not Modified`, so that the
    /// completed callback counts the right status.
    static var tokenGetNotModified: UnsafeMutableRawPointer { UnsafeMutableRawPointer(bitPattern: 6)! }
    /// What `tokenHead` becomes once answered `304 Not Modified`.
    static var tokenHeadNotModified: UnsafeMutableRawPointer { UnsafeMutableRawPointer(bitPattern: 7)! }
    /// `*socket_context` of a connection that holds a place in the `ConnectionLimiter`.
    static var admittedConnection: UnsafeMutableRawPointer { UnsafeMutableRawPointer(bitPattern: 1)! }
}

/// What a request's slot (`*con_cls`) holds, decoded from its bit pattern in this one place: the
/// protocol between `mhdURILog` (which sets a target marker), the access handler (which sets a
/// fast-path marker or a retained `RequestContext`) and the request-completed callback (which
/// reads it). The access handler and the completed callback switch over this value, never over
/// raw pointers; the target markers are made by `targetMarker` (ConnectionLimits.swift) and
/// answered by `targetRefusal` (RequestFramingCheck.swift).
enum RequestSlot {
    /// The access handler's first call: the slot is empty, or holds the marker `mhdURILog` set for
    /// a target it refuses (`SlotMarker.uriTooLong`, `.encodedNUL`, `.encodedSlash`,
    /// `.malformedTarget`). In the completed callback: the access handler never ran.
    case firstCall(target: UnsafeMutableRawPointer?)
    /// A `GET` (`isHead` false) or `HEAD /token` on the allocation-free path; `notModified` once it
    /// was answered `304 Not Modified`.
    case tokenRead(isHead: Bool, notModified: Bool)
    /// An ordinary request: its `RequestContext`, retained by the slot.
    case context(UnsafeMutableRawPointer)

    /// Decodes `raw`, what the slot holds.
    init(_ raw: UnsafeMutableRawPointer?) {
        guard let raw else {
            self = .firstCall(target: nil)
            return
        }
        switch raw {
        case SlotMarker.uriTooLong, SlotMarker.encodedNUL, SlotMarker.encodedSlash, SlotMarker.malformedTarget:
            self = .firstCall(target: raw)
        case SlotMarker.tokenGet: self = .tokenRead(isHead: false, notModified: false)
        case SlotMarker.tokenHead: self = .tokenRead(isHead: true, notModified: false)
        case SlotMarker.tokenGetNotModified: self = .tokenRead(isHead: false, notModified: true)
        case SlotMarker.tokenHeadNotModified: self = .tokenRead(isHead: true, notModified: true)
        default: self = .context(raw)
        }
    }

    /// The marker of a fast-path token read, for the slot.
    static func tokenReadMarker(isHead: Bool, notModified: Bool) -> UnsafeMutableRawPointer {
        switch (isHead, notModified) {
        case (false, false): SlotMarker.tokenGet
        case (true, false): SlotMarker.tokenHead
        case (false, true): SlotMarker.tokenGetNotModified
        case (true, true): SlotMarker.tokenHeadNotModified
        }
    }
}

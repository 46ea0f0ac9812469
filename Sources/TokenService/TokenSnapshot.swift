import ForgePushToken
import ForgePushTokenOwner
import HTTPServing
import ServerSupport

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

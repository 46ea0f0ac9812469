/// The service's token at one version: the value the owner keeps, the stores commit and the
/// subscribers receive.
///
/// `version` is the change counter: 0 for the first state a store ever held, one more for every
/// change of `token` (saturating at `UInt64.max`, so that no version can trap the process). It is
/// the event id of `GET /token/stream` (docs/http-api.md), so a version never names two values.
/// A value type; `Sendable`.
public struct TokenState: Sendable, Hashable, CustomStringConvertible {
    /// The change counter.
    public var version: UInt64
    /// The device token as lowercase hex digits (2 per byte), or `nil` when none is registered.
    public var token: String?

    /// A state at `version` holding `token`.
    public init(version: UInt64, token: String?) {
        self.version = version
        self.token = token
    }

    /// The longest device token the service keeps, in bytes (APNs tokens are 32 today; Apple
    /// documents them as of variable length). Its hex form is twice as long.
    public static let maxTokenBytes = 256

    /// The state a store starts from when it holds nothing yet: version 0, no token.
    public static let initial = TokenState(version: 0, token: nil)

    /// Why a store refuses a change at its last version (`CommitOutcome.versionExhausted`): no
    /// higher version is left to name it (an id must never name two values), and a version never
    /// goes back. The text of the 503 answer and the log line.
    public static let versionExhausted =
        "the version is the last one the store can keep (2^64 - 1 in a state file, 2^53 - 1 in Redis) and "
        + "no higher one is left; start afresh (a new state file, or the Redis key deleted with every replica stopped)"

    /// The state after changing the token to `token`: the version one higher (saturating).
    public func changed(to token: String?) -> TokenState {
        TokenState(version: version == .max ? .max : version + 1, token: token)
    }

    /// `version N, a token` or `version N, no token`: for log lines. Device tokens are not
    /// secrets, but the service's logs never print one: only whether there is one.
    public var description: String {
        "version \(version), \(token == nil ? "no token" : "a token")"
    }
}

/// What the owner hands to readers and subscribers for one version: a `TokenState` plus whatever
/// is derived from it once per version (the HTTP layer's `TokenSnapshot` holds the `GET /token`
/// body and the Server-Sent Events event, rendered lazily by their first reader, so that 10,000
/// subscribers share one rendering).
///
/// The owner calls `init(_:)` once per version that it applies, under its lock: keep it cheap and
/// free of I/O (render on first read, as `TokenSnapshot` does).
public protocol TokenRendition: Sendable {
    /// The rendition of `state` (made under the owner's lock: cheap, no I/O).
    init(_ state: TokenState)
    /// The state this rendition was made from.
    var state: TokenState { get }
    /// This rendition ready to be read by many subscribers at once: the owner calls it once per
    /// delivery, after releasing its lock and before offering the result to every subscriber
    /// (a lazy rendition renders here, once, instead of in every subscriber's first read).
    /// `self` by default.
    func prepared() -> Self
}

extension TokenRendition {
    /// `self`: a rendition with nothing to prepare.
    public func prepared() -> Self { self }
}

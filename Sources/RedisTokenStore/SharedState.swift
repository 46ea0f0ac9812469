#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// The token state as Redis holds it in `PREFIX:state`: the shared `version` (the event id of
/// every replica) and the token in lowercase hex, `nil` when no token is set.
///
/// Thread-safety: a value type, `Sendable`.
public struct SharedTokenState: Sendable, Equatable, CustomStringConvertible {
    /// The shared version; it only grows.
    public var version: UInt64
    /// The device token in lowercase hex, or `nil`.
    public var token: String?

    /// Creates a state.
    public init(version: UInt64, token: String?) {
        self.version = version
        self.token = token
    }

    /// `version N, a token` or `version N, no token`, for log lines: as the rest of the
    /// service's log, it never prints a device token, only whether there is one.
    public var description: String {
        "version \(version), \(token == nil ? "no token" : "a token")"
    }

    /// The largest version this service stores: versions travel through Lua numbers (doubles),
    /// exact up to 2^53.
    public static let maximumVersion: UInt64 = 1 << 53

    /// Whether `text` is a token as this service writes it: lowercase hex, at least one digit.
    public static func isValidToken(_ text: some StringProtocol) -> Bool {
        !text.isEmpty
            && text.utf8.allSatisfy { byte in
                (byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9"))
                    || (byte >= UInt8(ascii: "a") && byte <= UInt8(ascii: "f"))
            }
    }

    /// Parses a version as this service writes it: decimal digits, at most `maximumVersion`.
    public static func parseVersion(_ text: some StringProtocol) -> UInt64? {
        guard !text.isEmpty, text.utf8.count <= 16,
            text.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }),
            let value = UInt64(text), value <= maximumVersion
        else { return nil }
        return value
    }

    /// Why a value read from Redis is not a state this service wrote.
    public struct Invalid: Error, Equatable, CustomStringConvertible {
        /// What is wrong, one phrase.
        public let reason: String
        /// Creates the error.
        public init(_ reason: String) { self.reason = reason }
        /// The reason.
        public var description: String { reason }
    }

    /// Validates the fields of `PREFIX:state` as `HGETALL` returns them (field, value, ...):
    /// `version` decimal, `token` absent or lowercase hex. Other fields are ignored.
    /// - Returns: `nil` for an empty hash (the key is missing).
    /// - Throws: `Invalid` saying what is wrong.
    public static func fromHashFields(_ fields: [String: String]) throws(Invalid) -> SharedTokenState? {
        if fields.isEmpty { return nil }
        guard let versionText = fields["version"] else { throw Invalid("the field version is missing") }
        guard let version = parseVersion(versionText) else {
            throw Invalid("the field version is not a decimal number")
        }
        var token: String?
        if let tokenText = fields["token"] {
            guard isValidToken(tokenText) else { throw Invalid("the field token is not lowercase hex") }
            token = tokenText
        }
        return SharedTokenState(version: version, token: token)
    }

    /// The message published on `PREFIX:changes`: `{"version":N,"token":"<hex>"}` or
    /// `{"version":N,"token":null}`.
    public var changeMessage: String {
        if let token { return "{\"version\":\(version),\"token\":\"\(token)\"}" }
        return "{\"version\":\(version),\"token\":null}"
    }

    private struct Message: Decodable {
        let version: UInt64
        let token: String?
    }

    /// Parses and validates a message from `PREFIX:changes`.
    /// - Throws: `Invalid` when it is not JSON of that shape, or the token is not lowercase hex.
    public static func fromChangeMessage(_ bytes: [UInt8]) throws(Invalid) -> SharedTokenState {
        let message: Message
        do {
            message = try JSONDecoder().decode(Message.self, from: Data(bytes))
        } catch {
            throw Invalid("the change message is not {\"version\":N,\"token\":…}")
        }
        guard message.version <= maximumVersion else { throw Invalid("the change message's version is too large") }
        if let token = message.token, !isValidToken(token) {
            throw Invalid("the change message's token is not lowercase hex")
        }
        return SharedTokenState(version: message.version, token: message.token)
    }
}

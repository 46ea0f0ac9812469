import ForgePushToken
import ServerSupport

/// An entity tag (RFC 9110 §8.8.3): an opaque validator of one representation, sent in `ETag` and
/// compared with the ones a client sends in `If-None-Match`.
///
/// A value type; `Sendable`.
public struct EntityTag: Sendable, Hashable, CustomStringConvertible {
    /// The characters between the double quotes: `etagc` bytes of RFC 9110 §8.8.3 only
    /// (`0x21`, `0x23`–`0x7E`, `0x80`–`0xFF`).
    public let opaqueTag: String
    /// Whether it is a weak validator (`W/"…"`, RFC 9110 §8.8.1).
    public let isWeak: Bool

    /// Creates a tag, or `nil` when `opaqueTag` holds a byte that an entity tag cannot (a double
    /// quote, a space, a control character, DEL).
    public init?(opaqueTag: String, isWeak: Bool = false) {
        guard opaqueTag.utf8.allSatisfy(Self.isETagCharacter) else { return nil }
        self.opaqueTag = opaqueTag
        self.isWeak = isWeak
    }

    /// The strong validator of the representation whose body is `body`: the first 16 bytes of the
    /// body's SHA-256 digest as 32 lowercase hex digits, in double quotes. The body's bytes alone
    /// decide it, so two bodies that differ never share a tag and the same body always gets the same
    /// one, across restarts of the service and resets of its version counter.
    public static func strong(digesting body: some Collection<UInt8>) -> EntityTag {
        EntityTag(uncheckedOpaqueTag: DeviceTokenHex.encode(SHA256.digest(body).prefix(16)))
    }

    private init(uncheckedOpaqueTag: String) {
        self.opaqueTag = uncheckedOpaqueTag
        self.isWeak = false
    }

    /// The field value for `ETag`: `"<opaque>"`, or `W/"<opaque>"` for a weak tag.
    public var fieldValue: String { (isWeak ? "W/\"" : "\"") + opaqueTag + "\"" }

    /// `fieldValue`.
    public var description: String { fieldValue }

    /// `etagc` (RFC 9110 §8.8.3): `%x21 / %x23-7E / obs-text`.
    @inline(__always)
    static func isETagCharacter(_ byte: UInt8) -> Bool {
        byte == 0x21 || (byte >= 0x23 && byte <= 0x7e) || byte >= 0x80
    }
}

/// The `If-None-Match` precondition (RFC 9110 §13.1.2) of a `GET` or `HEAD`: whether the client
/// already holds the current representation, so that the answer is `304 Not Modified`.
///
/// A stateless namespace; thread-safe.
public enum IfNoneMatch {
    /// Whether the field value `field` matches a resource whose current representation has the tag
    /// `current`, i.e. whether the condition of RFC 9110 §13.1.2 is *false* and a `GET`/`HEAD`
    /// answers 304:
    /// - `*` matches (the resource always has a current representation);
    /// - otherwise `field` is a comma-separated list of entity tags (`#entity-tag`, empty list
    ///   elements and optional whitespace allowed, RFC 9110 §5.6.1), and it matches when one of
    ///   them equals `current` by the **weak comparison** of RFC 9110 §8.8.3.2: the opaque tags are
    ///   equal, whether either is weak or not (`W/"x"` matches `"x"`);
    /// - a field that is not that syntax at all (an unquoted tag, a lowercase `w/`, a stray
    ///   character, `*` inside a list, nothing but whitespace) matches nothing: the full answer is
    ///   always a correct answer to a conditional request.
    ///
    /// Reads the bytes in place: no allocation, so the cached `GET /token` path may call it.
    public static func matches(_ field: UnsafeBufferPointer<UInt8>, current: EntityTag) -> Bool {
        let space = UInt8(ascii: " ")
        let tab = UInt8(ascii: "\t")
        let quote = UInt8(ascii: "\"")
        let comma = UInt8(ascii: ",")
        let count = field.count
        var index = 0
        func skipWhitespace() {
            while index < count, field[index] == space || field[index] == tab { index += 1 }
        }
        skipWhitespace()
        if index < count, field[index] == UInt8(ascii: "*") {
            index += 1
            skipWhitespace()
            return index == count
        }
        var matched = false
        var sawTag = false
        while true {
            skipWhitespace()
            if index == count { break }
            if field[index] == comma {  // an empty list element
                index += 1
                continue
            }
            if field[index] == UInt8(ascii: "W") {  // weak = %s"W/": case-sensitive
                guard index + 1 < count, field[index + 1] == UInt8(ascii: "/") else { return false }
                index += 2
            }
            guard index < count, field[index] == quote else { return false }
            index += 1
            let start = index
            while index < count, field[index] != quote {
                guard EntityTag.isETagCharacter(field[index]) else { return false }
                index += 1
            }
            guard index < count else { return false }  // no closing quote
            if !matched, UnsafeBufferPointer(rebasing: field[start..<index]).elementsEqual(current.opaqueTag.utf8) {
                matched = true
            }
            index += 1
            sawTag = true
            skipWhitespace()
            if index < count {
                guard field[index] == comma else { return false }
                index += 1
            }
        }
        return sawTag && matched
    }

    /// `matches(_:current:)` for a field value held as a `String`; `nil` (no field) matches nothing.
    public static func matches(_ field: String?, current: EntityTag) -> Bool {
        guard var field else { return false }
        return field.withUTF8 { matches($0, current: current) }
    }
}

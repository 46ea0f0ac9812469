import ForgePushTokenOwner

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// How a `TokenState` is kept in Redis and announced between replicas (docs/replicas.md, "What
/// lives in Redis"): the hash `PREFIX:state` with the fields `version` (decimal) and, while a token is
/// set, `token` (lowercase hex); and one message per change on `PREFIX:changes`,
/// `{"version":N,"token":"<hex>"}` or `{"version":N,"token":null}`, with a `"writer"` field naming
/// the store whose script published it (so that a store does not apply its own write twice); and
/// the delivery probes on `PREFIX:probe`, `WRITER:SEQUENCE`.
///
/// Versions travel through Lua numbers (doubles), which are exact up to 2^53 - 1: a version above
/// `maximumVersion` read from Redis (hash, message or script reply) is invalid, as a negative or
/// non-numeric one is, and the scripts never write one.
///
/// Thread-safety: stateless.
enum RedisCodec {
    /// The largest version kept in Redis: 2^53 - 1, the largest integer a Lua number holds exactly.
    static let maximumVersion: UInt64 = (1 << 53) - 1

    /// Why a value read from Redis is not a state this service wrote.
    struct Invalid: Error, Equatable, CustomStringConvertible {
        /// What is wrong, one phrase.
        let reason: String
        /// Creates the error.
        init(_ reason: String) { self.reason = reason }
        /// The reason.
        var description: String { reason }
    }

    /// Whether `text` is a token as this service writes it: 2 to 512 lowercase hex digits, an even
    /// number (a whole number of bytes, at most `TokenState.maxTokenBytes`), as the state file
    /// requires too.
    static func isValidToken(_ text: some StringProtocol) -> Bool {
        let count = text.utf8.count
        return count >= 2 && count <= 2 * TokenState.maxTokenBytes && count.isMultiple(of: 2)
            && text.utf8.allSatisfy { byte in
                (byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9"))
                    || (byte >= UInt8(ascii: "a") && byte <= UInt8(ascii: "f"))
            }
    }

    /// Parses a version as this service writes it: decimal digits, at most `maximumVersion`.
    static func parseVersion(_ text: some StringProtocol) -> UInt64? {
        guard !text.isEmpty, text.utf8.count <= 16,
            text.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }),
            let value = UInt64(text), value <= maximumVersion
        else { return nil }
        return value
    }

    /// Validates the fields of `PREFIX:state` as `HGETALL` returns them: `version` decimal and at
    /// most `maximumVersion`, `token` absent or lowercase hex. Other fields are ignored.
    /// - Returns: `nil` for an empty hash (the key is missing).
    /// - Throws: `Invalid` saying what is wrong.
    static func state(hash fields: [String: String]) throws(Invalid) -> TokenState? {
        if fields.isEmpty { return nil }
        guard let versionText = fields["version"] else { throw Invalid("the field version is missing") }
        guard let version = parseVersion(versionText) else {
            throw Invalid("the field version is not a decimal number up to 2^53 - 1")
        }
        var token: String?
        if let tokenText = fields["token"] {
            guard isValidToken(tokenText) else { throw Invalid("the field token is not lowercase hex") }
            token = tokenText
        }
        return TokenState(version: version, token: token)
    }

    /// A change as a message on `PREFIX:changes` carries it.
    struct Change: Equatable {
        /// The state after the change.
        var state: TokenState
        /// The store whose script published it (`RedisLink.writerID`), `nil` when the message does
        /// not say (a replica of an older release).
        var writer: String?
    }

    /// The message for `state`, as the scripts publish it (the tests compare with it); without
    /// `writer`, as a replica of an older release published it.
    static func message(_ state: TokenState, writer: String?) -> String {
        let token = state.token.map { "\"\($0)\"" } ?? "null"
        let from = writer.map { ",\"writer\":\"\($0)\"" } ?? ""
        return "{\"version\":\(state.version),\"token\":\(token)\(from)}"
    }

    private struct Message: Decodable {
        let version: UInt64
        let token: String?
        let writer: String?
    }

    /// Parses and validates a message from `PREFIX:changes`.
    /// - Throws: `Invalid` when it is not JSON of that shape, the version is above
    ///   `maximumVersion`, the token is not lowercase hex, or it is not byte for byte the text a
    ///   script publishes (`message(_:writer:)`): JSON allows `1e3` or spaces where the scripts
    ///   write decimal digits, and the hash refuses them, so a message must too (attack finding: a
    ///   hand-published `{"version":1e3,…}` was served and then written back to the hash).
    static func change(message bytes: [UInt8]) throws(Invalid) -> Change {
        let message: Message
        do {
            message = try JSONDecoder().decode(Message.self, from: Data(bytes))
        } catch {
            throw Invalid("the change message is not {\"version\":N,\"token\":…}")
        }
        guard message.version <= maximumVersion else {
            throw Invalid("the change message's version is above 2^53 - 1")
        }
        if let token = message.token, !isValidToken(token) {
            throw Invalid("the change message's token is not lowercase hex")
        }
        let state = TokenState(version: message.version, token: message.token)
        guard bytes.elementsEqual(Self.message(state, writer: message.writer).utf8) else {
            throw Invalid("the change message is not written as the scripts write it")
        }
        return Change(state: state, writer: message.writer)
    }

    /// A delivery probe on `PREFIX:probe`: `WRITER:SEQUENCE` (the store's random id, and the
    /// probe's number in decimal).
    static func probe(writer: String, sequence: UInt64) -> String {
        "\(writer):\(sequence)"
    }

    /// Whether `bytes` has the shape of a probe of any replica: 1 to 16 lowercase hex digits (a
    /// writer id), `:`, 1 to 20 decimal digits.
    static func isProbe(_ bytes: [UInt8]) -> Bool {
        guard let colon = bytes.firstIndex(of: UInt8(ascii: ":")) else { return false }
        let writer = bytes[..<colon]
        let digits = bytes[(colon + 1)...]
        return (1...16).contains(writer.count) && (1...20).contains(digits.count)
            && writer.allSatisfy { ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x61 && $0 <= 0x66) }
            && digits.allSatisfy { $0 >= 0x30 && $0 <= 0x39 }
    }

    /// The sequence number of a probe that `writer` published, or `nil` for another store's
    /// probe or anything else.
    static func probeSequence(_ bytes: [UInt8], writer: String) -> UInt64? {
        let prefix = Array(writer.utf8) + [UInt8(ascii: ":")]
        guard bytes.count > prefix.count, bytes.count <= prefix.count + 20, bytes.starts(with: prefix) else {
            return nil
        }
        let digits = bytes[prefix.count...]
        guard digits.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }) else { return nil }
        return UInt64(String(decoding: digits, as: UTF8.self))
    }
}

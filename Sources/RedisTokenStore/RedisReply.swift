/// One Redis reply, decoded from hiredis' `redisReply` into Swift values (Redis protocol RESP2,
/// "Redis serialization protocol specification" in the Redis documentation).
///
/// Thread-safety: a value type, `Sendable`.
public indirect enum RedisReply: Sendable, Equatable {
    /// A bulk string, binary-safe.
    case bulk([UInt8])
    /// A simple status such as `OK` or `QUEUED`.
    case status(String)
    /// An integer.
    case integer(Int64)
    /// The null bulk string or null array.
    case null
    /// An error reply such as `NOSCRIPT No matching script`.
    case error(String)
    /// An array of replies.
    case array([RedisReply])

    /// The reply as text when it is a bulk string or a status (bulk bytes decoded as UTF-8,
    /// invalid sequences replaced).
    public var text: String? {
        switch self {
        case .bulk(let bytes): return String(decoding: bytes, as: UTF8.self)
        case .status(let text): return text
        default: return nil
        }
    }

    /// The first word of an error reply (`NOSCRIPT`, `READONLY`, `WRONGPASS`...), or `nil`.
    public var errorCode: String? {
        guard case .error(let message) = self else { return nil }
        return String(message.prefix(while: { $0 != " " }))
    }
}

/// The service's token at one version, with the bytes every reader of that version shares.
///
/// `version` is 0 for the state the service started with and grows by one with every change of
/// the token (http-api.md, `GET /token/stream`). The JSON body of `GET /token` and the SSE event
/// are rendered once per version, not once per request or subscriber.
/// A value type; `Sendable`; the byte arrays share storage between copies.
public struct TokenSnapshot: Sendable, Equatable {
    /// The change counter: 0 at start, +1 per change of `token`.
    public let version: UInt64
    /// The device token as lowercase hex digits (2 per byte), or `nil` when none is registered.
    public let token: String?
    /// The body of `GET /token`: `{"token":"<hex>"}` or `{"token":null}`, UTF-8 JSON.
    public let tokenBody: [UInt8]
    /// The SSE event for this version: `id: <version>`, `event: token`,
    /// `data: {"token":…}`, empty line.
    public let event: [UInt8]

    /// Renders the snapshot of `token` at `version`.
    public init(version: UInt64, token: String?) {
        self.version = version
        self.token = token
        self.tokenBody = JSONBody.encode(TokenBody(token: token))
        self.event = ServerSentEvents.event(id: String(version), name: "token",
                                            data: String(decoding: tokenBody, as: UTF8.self))
    }

    public static func == (lhs: TokenSnapshot, rhs: TokenSnapshot) -> Bool {
        lhs.version == rhs.version && lhs.token == rhs.token
    }
}

/// `{"token":"<hex>"}` or `{"token":null}`: the key is always present.
struct TokenBody: Encodable {
    let token: String?

    func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(token, forKey: .token)
    }

    enum CodingKeys: String, CodingKey { case token }
}

/// `{"token":"<hex>"|null,"changed":true|false}`: the answer to `POST /register` and `POST /fail`.
struct ChangeBody: Encodable {
    let token: String?
    let changed: Bool

    func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(token, forKey: .token)
        try container.encode(changed, forKey: .changed)
    }

    enum CodingKeys: String, CodingKey { case token, changed }
}

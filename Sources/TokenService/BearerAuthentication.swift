import HTTPServing
import ServerSupport

/// Bearer-token authentication of requests (RFC 6750) with two roles (docs/operations.md, "Read
/// and write tokens"): write tokens may call every route, read tokens only the reads (`GET`/`HEAD
/// /token`, `/token/stream`, `/metrics` and `/`). Protected routes need `Authorization: Bearer
/// <token>` or, for `GET` and `HEAD`, the query parameter `access_token=<token>` (RFC 6750 §2.3; a
/// browser's `EventSource` cannot send header fields). The probes (`/healthz`, `/livez`,
/// `/readyz`: `Route.Access.open`) are never protected.
///
/// Two ways to build one:
/// - `init(token:scope:)`: the one token of `--auth-token` / `--auth-token-file`, a write token;
///   under scope `all` the reads need it too.
/// - `init(writeTokens:readTokens:)`: the sets of `--write-token-file` and `--read-token-file`
///   (each 1 to 64 tokens, `TokenFile`); with a read set the reads need a read or a write token,
///   without one they are open.
///
/// `check(authorization:query:method:)` compares what was sent with every token of both sets,
/// with no early exit: it takes the same time whatever the sent value shares with a token and
/// whichever token matches, so no token can be guessed byte by byte from response times. The
/// tokens are never part of a description, log line or error message.
///
/// A value type; `Sendable`.
public struct BearerAuthentication: Sendable {
    /// Which routes need a token under `--auth-token` (`--auth-scope`).
    public enum Scope: String, Sendable, CaseIterable {
        /// `POST /register` and `POST /fail` (the default).
        case writes
        /// Every route but the probes: also `/token`, `/token/stream`, `/metrics` and `/`.
        case all
    }

    /// What a token may do.
    public enum Role: String, Sendable, CaseIterable {
        /// The reads only (`--read-token-file`).
        case read
        /// Every route (`--write-token-file`, `--auth-token`).
        case write
    }

    /// Which routes need a token: `.all` when the reads do (scope `all`, or a read-token set).
    public let scope: Scope
    /// The write tokens (at least one), distinct, in file order.
    private let writeTokens: [[UInt8]]
    /// The read tokens, distinct and none of them a write token; empty under `--auth-token`.
    private let readTokens: [[UInt8]]
    /// Counts the token sets the service has held (`Responder.replaceCredentials(_:)` sets it):
    /// a grant of an older generation is checked again before a stream it admitted is kept.
    var generation: UInt64 = 0

    /// The realm named in `WWW-Authenticate` (RFC 6750 §3).
    public static let realm = "forge-push-token"

    /// Creates the policy of the one `--auth-token`, a write token, or `nil` when `token` is not a
    /// `b64token` of RFC 6750 §2.1 (1 or more of `A–Z a–z 0–9 - . _ ~ + /`, then any number of
    /// `=`), the only form a Bearer credential can take.
    public init?(token: String, scope: Scope = .writes) {
        guard Self.isValidToken(token) else { return nil }
        self.writeTokens = [Array(token.utf8)]
        self.readTokens = []
        self.scope = scope
    }

    /// Creates the policy of the token files: `writeTokens` may write and read, `readTokens` (or
    /// `nil` without a read-token file: reads are open) may only read. `nil` when `writeTokens`
    /// is empty or a token is not a `b64token` (`TokenFile.parse(_:)` has checked the files'
    /// rules already). A token in both sets is a write token; repeated tokens count once.
    public init?(writeTokens: [String], readTokens: [String]?) {
        guard !writeTokens.isEmpty,
            (writeTokens + (readTokens ?? [])).allSatisfy(Self.isValidToken)
        else { return nil }
        var seen: Set<[UInt8]> = []
        self.writeTokens = writeTokens.map { Array($0.utf8) }.filter { seen.insert($0).inserted }
        self.readTokens = (readTokens ?? []).map { Array($0.utf8) }.filter { seen.insert($0).inserted }
        self.scope = readTokens == nil ? .writes : .all
    }

    /// How many distinct tokens have `role`.
    public func tokenCount(_ role: Role) -> Int {
        role == .write ? writeTokens.count : readTokens.count
    }

    /// Every token of both roles (for finding the revoked ones on a reload; never compared with
    /// what a client sent).
    var allTokens: Set<[UInt8]> { Set(writeTokens).union(readTokens) }

    /// Whether `grant` still stands: given by this very set of tokens, or its token is still one
    /// of this policy's (in either role: a stream only reads).
    func admits(_ grant: Grant) -> Bool {
        grant.generation == generation || writeTokens.contains(grant.token) || readTokens.contains(grant.token)
    }

    /// Whether `token` has the `b64token` syntax of RFC 6750 §2.1.
    public static func isValidToken(_ token: String) -> Bool {
        isValidToken(token.utf8)
    }

    /// Whether `bytes` have the `b64token` syntax of RFC 6750 §2.1.
    static func isValidToken(_ bytes: some Collection<UInt8>) -> Bool {
        !bytes.isEmpty && invalidTokenByte(bytes) == nil
    }

    /// The offset of the first byte that breaks the `b64token` syntax in `bytes` (a character
    /// outside the alphabet, or one after a trailing `=`), or `nil` when there is none.
    static func invalidTokenByte(_ bytes: some Collection<UInt8>) -> Int? {
        var padding = false
        for (offset, byte) in bytes.enumerated() {
            if byte == UInt8(ascii: "=") {
                if offset == 0 { return 0 }
                padding = true
                continue
            }
            guard !padding, isTokenCharacter(byte) else { return offset }
        }
        return nil
    }

    private static func isTokenCharacter(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"):
            true
        case UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"), UInt8(ascii: "+"),
            UInt8(ascii: "/"):
            true
        default:
            false
        }
    }

    /// Whether a request for `route` needs a token under this policy (the route table's
    /// `Route.access`): the writes always, the reads when `scope` is `.all`, the probes never.
    public func protects(_ route: Route) -> Bool {
        switch route.access {
        case .open: false
        case .write: true
        case .read: scope == .all
        }
    }

    /// Which token admitted a request: its role, and the token itself, so that an event stream
    /// can be ended when its token is revoked (`Responder.replaceCredentials(_:)`). The token is
    /// never printed (`description` names the role only).
    public struct Grant: Sendable, Equatable, CustomStringConvertible {
        /// What the token may do.
        public let role: Role
        /// The token that matched.
        let token: [UInt8]
        /// The `generation` of the policy that matched it.
        let generation: UInt64

        /// `read grant` or `write grant`: never the token.
        public var description: String { "\(role.rawValue) grant" }
    }

    /// The outcome of checking one request's credentials.
    public enum Outcome: Sendable, Equatable {
        /// A token matched; the grant says which role.
        case authorized(Grant)
        /// No credentials were sent.
        case missing
        /// Credentials were sent but matched no token, or were malformed.
        case invalid
        /// Whether a token matched, in either role.
        public var isAuthorized: Bool {
            if case .authorized = self { true } else { false }
        }
    }

    /// Checks the credentials of a request: the `Authorization` field's value, else (only for
    /// `GET` and `HEAD`, per the service's contract) the `access_token` query parameter.
    /// - Parameters:
    ///   - authorization: the `Authorization` header field, or `nil`. The scheme name `Bearer` is
    ///     case-insensitive (RFC 9110 §11.1); one or more spaces follow it.
    ///   - query: the request's query string without `?`, or `nil`.
    ///   - method: the request method.
    public func check(authorization: String?, query: String?, method: String) -> Outcome {
        if let authorization {
            let value = authorization.utf8
            guard value.count > 7, value.prefix(6).elementsEqual("bearer".utf8, by: { asciiLower($0) == $1 }),
                value.dropFirst(6).first == UInt8(ascii: " ")
            else { return .invalid }
            return match(value.dropFirst(6).drop { $0 == UInt8(ascii: " ") })
        }
        guard method == "GET" || method == "HEAD", let query,
            let sent = RequestBodies.formField("access_token", in: query)
        else { return .missing }
        guard let decoded = RequestBodies.percentDecoded(sent) else { return .invalid }
        return match(decoded.utf8)
    }

    /// Compares `sent` with every token, write tokens first, without an early exit: the time
    /// depends on `sent`'s length and the sets' sizes only. At most one token can match (the sets
    /// are distinct); its index is picked with masks, not branches.
    private func match(_ sent: some Collection<UInt8>) -> Outcome {
        var matched: UInt = 0
        var matchedIndex = 0
        var index = 0
        for token in writeTokens {
            let mask = Self.equalityMask(sent, token)
            matched |= mask
            matchedIndex |= index & Int(bitPattern: mask)
            index += 1
        }
        for token in readTokens {
            let mask = Self.equalityMask(sent, token)
            matched |= mask
            matchedIndex |= index & Int(bitPattern: mask)
            index += 1
        }
        guard matched != 0 else { return .invalid }
        let role: Role = matchedIndex < writeTokens.count ? .write : .read
        let token = role == .write ? writeTokens[matchedIndex] : readTokens[matchedIndex - writeTokens.count]
        return .authorized(Grant(role: role, token: token, generation: generation))
    }

    /// All ones when `sent` equals `secret`, else zero, in time that depends on `sent`'s length
    /// only, never on where the two first differ; a different length is a mismatch, found in the
    /// same loop.
    static func equalityMask(_ sent: some Collection<UInt8>, _ secret: [UInt8]) -> UInt {
        guard !secret.isEmpty else { return 0 }
        var difference: UInt = sent.count == secret.count ? 0 : 1
        var index = 0
        for byte in sent {
            difference |= UInt(byte ^ secret[index % secret.count])
            index += 1
        }
        // 0 - 1 = all ones when there was no difference; 0 - 0 = 0 otherwise (no branch).
        return 0 &- ((difference &- 1) >> (UInt.bitWidth - 1))
    }

    /// Whether `sent` equals `secret`, compared as `equalityMask(_:_:)` does.
    static func constantTimeEquals(_ sent: some Collection<UInt8>, _ secret: [UInt8]) -> Bool {
        equalityMask(sent, secret) != 0
    }

    /// The 401 answer to a request whose check gave `outcome` (`.missing` or `.invalid`): code
    /// `unauthorized` with `WWW-Authenticate: Bearer realm="…"`, plus `error="invalid_token"` when
    /// a wrong token was sent (RFC 6750 §3). The message names the `access_token` query parameter
    /// only to a `GET` or `HEAD`, the only methods that may use it.
    public static func unauthorized(_ outcome: Outcome, method: String) -> HTTPResponse {
        var challenge = "Bearer realm=\"\(realm)\""
        let message: String
        if outcome == .invalid {
            challenge += ", error=\"invalid_token\""
            message = "the bearer token is none of the service's tokens"
        } else {
            message =
                "send a token of the service as 'Authorization: Bearer <token>'"
                + (method == "GET" || method == "HEAD" ? " or as the access_token query parameter" : "")
        }
        return .error(401, ServiceError("unauthorized", message), headers: ["WWW-Authenticate": challenge])
    }

    /// The 403 answer to a write sent with a read token (docs/operations.md, "Read and write
    /// tokens"; RFC 6750 §3.1): code
    /// `insufficient_scope` with `WWW-Authenticate: Bearer realm="…", error="insufficient_scope"`.
    public static let insufficientScope = HTTPResponse.error(
        403,
        ServiceError("insufficient_scope", "a read token may not write; send a write token"),
        headers: ["WWW-Authenticate": "Bearer realm=\"\(realm)\", error=\"insufficient_scope\""])
}

extension BearerAuthentication: CustomStringConvertible {
    /// `Bearer authentication (scope writes)`, or with token files
    /// `Bearer authentication (scope all, 2 write tokens, 1 read token)`: never a token.
    public var description: String {
        guard !readTokens.isEmpty || writeTokens.count > 1 else {
            return "Bearer authentication (scope \(scope.rawValue))"
        }
        func count(_ n: Int, _ role: Role) -> String { "\(n) \(role.rawValue) token\(n == 1 ? "" : "s")" }
        return
            "Bearer authentication (scope \(scope.rawValue), \(count(writeTokens.count, .write)), \(count(readTokens.count, .read)))"
    }
}

import ForgePushToken
import ForgePushTokenOwner
import Foundation
import HTTPServing
import ServerSupport
import Testing

@testable import TokenService

/// Token files (issue 28, docs/operations.md "Read and write tokens"): what a file may hold.
@Suite("Token files")
struct TokenFileTests {
    static let sixteen = "0123456789abcdef"

    func parse(_ text: String) throws(TokenFile.Error) -> [String] {
        try TokenFile.parse(Array(text.utf8))
    }

    @Test("one token a line; blank lines and # comments skipped; blanks trimmed")
    func form() throws {
        let text = "# the writers\n\n  \(Self.sixteen)  \n\t# indented comment\n\(Self.sixteen)XY==\n"
        #expect(try parse(text) == [Self.sixteen, Self.sixteen + "XY=="])
    }

    @Test("CRLF line ends are read as LF ones")
    func crlf() throws {
        let text = "# comment\r\n\(Self.sixteen)\r\n\r\nABCDEFGHIJKLMNOP\r\n"
        #expect(try parse(text) == [Self.sixteen, "ABCDEFGHIJKLMNOP"])
        #expect(try parse(Self.sixteen + "\r") == [Self.sixteen])
    }

    @Test("errors name the line and the reason, never the token; 15 characters is short, 16 to 512 fit")
    func errors() throws {
        let fifteen = String(Self.sixteen.dropLast())
        func refusal(_ text: String) -> TokenFile.Error? {
            do {
                _ = try parse(text)
                return nil
            } catch {
                return error
            }
        }
        let short = try #require(refusal("# c\n\n\(fifteen)\n"))
        #expect(short.line == 3)
        #expect(short.reason.contains("15 characters"))
        #expect(!short.description.contains(fifteen))
        #expect(try parse(Self.sixteen) == [Self.sixteen])
        #expect(try parse(String(repeating: "a", count: 512)).count == 1)
        #expect(refusal(String(repeating: "a", count: 513))?.reason.contains("513 characters") == true)

        let bad = try #require(refusal("\(Self.sixteen)\nsecret-part with space\n"))
        #expect(bad.line == 2 && bad.reason.contains("character 12"))
        #expect(!bad.description.contains("secret-part"))
        #expect(refusal("naïve-but-long-enough")?.line == 1)
        #expect(refusal("abcdefghijklmnop=q")?.line == 1)

        let none = try #require(refusal("# only a comment\n\n   \n"))
        #expect(none.line == nil && none.description.contains("no token"))
        #expect(refusal("")?.line == nil)
    }

    @Test("64 tokens are a file; a 65th is refused on its line")
    func count() throws {
        let tokens = (0..<65).map { String(format: "token-%010d", $0) }
        #expect(try parse(tokens.prefix(64).joined(separator: "\n")).count == 64)
        let text = "# header\n" + tokens.joined(separator: "\n")
        #expect(throws: TokenFile.Error(line: 66, reason: "one token more than the 64 a file may hold")) {
            try parse(text)
        }
    }
}

/// Read and write roles, several tokens, reloads (issue 28, docs/operations.md "Read and write
/// tokens") through `Responder`.
@Suite("Credentials: roles and reloads")
struct CredentialRoleTests {
    static let write = ["write-token-0000000000", "write-token-1111111111"]
    static let read = ["read-token-00000000000", "read-token-11111111111"]

    func responder(read: [String]? = Self.read, write: [String] = Self.write) throws -> Responder {
        let authentication = try #require(BearerAuthentication(writeTokens: write, readTokens: read))
        return Responder(owner: makeOwner(maxSubscribers: 64), authentication: authentication)
    }

    func bearer(_ token: String) -> HTTPHeaders { ["Authorization": "Bearer " + token] }

    /// `GET /token/stream` with `headers` (or `target`'s query) up to `StreamGate.open(for:wake:)`.
    func stream(
        _ responder: Responder, target: String = "/token/stream", headers: HTTPHeaders = HTTPHeaders(),
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws -> StreamGate.Subscription {
        let request = HTTPRequest(method: "GET", target: target, headers: headers)
        guard case .proceed(let admitted, _) = responder.admit(request) else {
            Issue.record("the stream was not admitted", sourceLocation: sourceLocation)
            throw Unexpected(description: "not admitted")
        }
        let (head, subscription) = responder.streams.open(for: admitted) {}
        #expect(head.status == 200, sourceLocation: sourceLocation)
        return try #require(subscription, sourceLocation: sourceLocation)
    }

    @Test("a read token on a write: 403 insufficient_scope with the RFC 6750 challenge; nothing changes")
    func readTokenCannotWrite() throws {
        let responder = try responder()
        for token in Self.read {
            for path in ["/register", "/fail"] {
                let response = try responder.send(
                    "POST", path, contentType: "text/plain", body: utf8("abcd"), headers: bearer(token))
                try expectError(response, status: 403, code: "insufficient_scope")
                #expect(
                    response.headers["WWW-Authenticate"]
                        == "Bearer realm=\"forge-push-token\", error=\"insufficient_scope\"")
                #expect(!string(response.body).contains(token))
            }
        }
        #expect(responder.owner.current == TokenSnapshot(version: 0, token: nil))
        let metrics = try responder.send("GET", "/metrics", headers: bearer(Self.read[0]))
        #expect(string(metrics.body).contains("forge_push_token_forbidden_requests_total 4\n"))
        #expect(string(metrics.body).contains("forge_push_token_unauthorized_requests_total 0\n"))
    }

    @Test("every write token writes; a missing or unknown token is 401 as before")
    func writeTokensWrite() throws {
        let responder = try responder()
        for (index, token) in Self.write.enumerated() {
            let response = try responder.send(
                "POST", "/register", contentType: "text/plain", body: utf8("abc\(index)"), headers: bearer(token))
            #expect(response.status == 200)
        }
        #expect(responder.owner.current.token == "abc1")
        try expectError(try responder.send("POST", "/fail"), status: 401, code: "unauthorized")
        let wrong = try responder.send("POST", "/fail", headers: bearer(Self.read[0] + "x"))
        try expectError(wrong, status: 401, code: "unauthorized")
        #expect(wrong.headers["WWW-Authenticate"] == "Bearer realm=\"forge-push-token\", error=\"invalid_token\"")
    }

    @Test("with a read-token file every read needs a read or a write token; the probe stays open")
    func readsNeedAToken() throws {
        let responder = try responder()
        #expect(!responder.answersCachedReadsBlindly)
        for path in ["/token", "/metrics", "/"] {
            for method in ["GET", "HEAD"] {
                try expectError(try responder.send(method, path), status: 401, code: "unauthorized")
                for token in Self.read + Self.write {
                    #expect(try responder.send(method, path, headers: bearer(token)).status == 200)
                    #expect(try responder.send(method, path + "?access_token=" + token).status == 200)
                }
            }
        }
        for token in Self.read + Self.write {
            _ = try stream(responder, target: "/token/stream?access_token=" + token)
            _ = try stream(responder, headers: bearer(token))
        }
        #expect(try responder.send("GET", "/healthz").status == 200)
    }

    @Test("without a read-token file the reads are open and the writes still need a write token")
    func readsOpenWithoutReadFile() throws {
        let responder = try responder(read: nil)
        #expect(responder.answersCachedReadsBlindly)
        for path in ["/token", "/metrics", "/"] {
            #expect(try responder.send("GET", path).status == 200)
        }
        try expectError(try responder.send("POST", "/fail"), status: 401, code: "unauthorized")
        #expect(try responder.send("POST", "/fail", headers: bearer(Self.write[1])).status == 200)
    }

    @Test("a token in both files is a write token; repeats count once")
    func overlaps() throws {
        let authentication = try #require(
            BearerAuthentication(
                writeTokens: [Self.write[0], Self.write[0]], readTokens: [Self.write[0], Self.read[0]]))
        #expect(authentication.tokenCount(.write) == 1 && authentication.tokenCount(.read) == 1)
        guard
            case .authorized(let grant) = authentication.check(
                authorization: "Bearer " + Self.write[0], query: nil, method: "POST")
        else {
            Issue.record("the token was refused")
            return
        }
        #expect(grant.role == .write)
        #expect(!"\(authentication)".contains(Self.write[0]) && !"\(grant)".contains(Self.write[0]))
        #expect(BearerAuthentication(writeTokens: [], readTokens: Self.read) == nil)
        #expect(BearerAuthentication(writeTokens: ["has space"], readTokens: nil) == nil)
    }

    @Test("each token matches with its own role, whichever position it has in its set")
    func everyPosition() throws {
        let write = (0..<64).map { String(format: "write-%016d", $0) }
        let read = (0..<64).map { String(format: "read-%017d", $0) }
        let authentication = try #require(BearerAuthentication(writeTokens: write, readTokens: read))
        for (tokens, role) in [(write, BearerAuthentication.Role.write), (read, .read)] {
            for token in tokens {
                let outcome = authentication.check(authorization: "Bearer " + token, query: nil, method: "GET")
                guard case .authorized(let grant) = outcome else {
                    Issue.record("\(role) token refused")
                    continue
                }
                #expect(grant.role == role && grant.token == Array(token.utf8))
            }
        }
        for near in [write[5].dropLast() + "x", read[63] + "0", String(read[0].dropLast()), ""] {
            #expect(authentication.check(authorization: "Bearer " + near, query: nil, method: "GET") == .invalid)
        }
    }

    @Test("the equality mask is all ones on a match and zero otherwise")
    func equalityMask() {
        let secret = Array("abcdef".utf8)
        for candidate in ["abcdef", "abcdeF", "abcde", "abcdefg", "", "zzzzzz", "abcabc"] {
            let mask = BearerAuthentication.equalityMask(Array(candidate.utf8), secret)
            #expect(mask == (candidate == "abcdef" ? UInt.max : 0), "\(candidate)")
        }
    }

    @Test("a reload applies from the next request; old tokens are refused, new ones accepted")
    func reloadApplies() throws {
        let responder = try responder()
        let new = try #require(BearerAuthentication(writeTokens: ["new-write-token-00000"], readTokens: Self.read))
        #expect(responder.replaceCredentials(new) == 0)
        try expectError(
            try responder.send("POST", "/fail", headers: bearer(Self.write[0])), status: 401, code: "unauthorized")
        #expect(try responder.send("POST", "/fail", headers: bearer("new-write-token-00000")).status == 200)
        let metrics = string(try responder.send("GET", "/metrics", headers: bearer(Self.read[1])).body)
        #expect(metrics.contains("forge_push_token_credentials_tokens{role=\"read\"} 2\n"))
        #expect(metrics.contains("forge_push_token_credentials_tokens{role=\"write\"} 1\n"))
        // A policy that protects other routes is not a reload of the same files.
        #expect(
            responder.replaceCredentials(try #require(BearerAuthentication(writeTokens: Self.write, readTokens: nil)))
                == nil)
        try expectError(try responder.send("GET", "/token"), status: 401, code: "unauthorized")
    }

    @Test("a reload ends exactly the streams whose token was removed, cleanly, after a whole event")
    func reloadEndsRevokedStreams() throws {
        let responder = try responder()
        let revoked = try (0..<5).map { _ in try stream(responder, headers: bearer(Self.read[0])) }
        let revokedWriter = try stream(responder, target: "/token/stream?access_token=" + Self.write[1])
        let kept = try (0..<5).map { _ in try stream(responder, headers: bearer(Self.read[1])) }
        // Moved from the write set to the read set: it may still read, so its stream stays.
        let moved = try stream(responder, headers: bearer(Self.write[0]))
        for subscription in revoked + [revokedWriter] + kept + [moved] {
            #expect(drain(subscription.subscriber).result == .suspended)
        }
        let new = try #require(
            BearerAuthentication(writeTokens: ["new-write-token-00000"], readTokens: [Self.read[1], Self.write[0]]))
        #expect(responder.replaceCredentials(new) == 6)
        for subscription in revoked + [revokedWriter] {
            #expect(drain(subscription.subscriber).result == .endOfStream)
            #expect(subscription.subscriber.endReason == .revoked)
        }
        for subscription in kept + [moved] {
            #expect(drain(subscription.subscriber).result == .suspended)
            #expect(subscription.subscriber.endReason == nil)
        }
        #expect(responder.owner.subscriberCount == 12, "ended streams leave when their connection goes")
        // Their connections go, as the engine reports it: counted under reason="revoked".
        for subscription in revoked + [revokedWriter] {
            responder.streams.ended(subscription.subscriber)
            subscription.cancel()
        }
        let metrics = string(try responder.send("GET", "/metrics", headers: bearer(Self.read[1])).body)
        #expect(metrics.contains("forge_push_token_streams_ended_total{reason=\"revoked\"} 6\n"), "\(metrics)")
        #expect(responder.owner.subscriberCount == 6)
    }

    @Test("a stream admitted before a reload that revoked its token ends once subscribed")
    func admittedBeforeReload() throws {
        let responder = try responder()
        let request = HTTPRequest(method: "GET", target: "/token/stream", headers: bearer(Self.read[0]))
        guard case .proceed(let admitted, _) = responder.admit(request) else {
            Issue.record("not admitted")
            return
        }
        let new = try #require(BearerAuthentication(writeTokens: Self.write, readTokens: [Self.read[1]]))
        #expect(responder.replaceCredentials(new) == 0, "no stream is open yet")
        let (head, subscription) = responder.streams.open(for: admitted) {}
        #expect(head.status == 200)
        let stream = try #require(subscription)
        let out = drain(stream.subscriber)
        #expect(out.result == .endOfStream)
        #expect(stream.subscriber.endReason == .revoked)
        #expect(string(out.bytes) == expectedEvent(0, nil), "its one event, then the end")

        // Admitted under a set that still holds its token: it stays.
        guard
            case .proceed(let kept, _) = responder.admit(
                HTTPRequest(method: "GET", target: "/token/stream", headers: bearer(Self.read[1])))
        else {
            Issue.record("not admitted")
            return
        }
        #expect(responder.replaceCredentials(new) == 0)
        let (_, second) = responder.streams.open(for: kept) {}
        #expect(drain(try #require(second).subscriber).result == .suspended)
    }
}

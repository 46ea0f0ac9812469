import ForgePushToken
import ForgePushTokenOwner
import Foundation
import HTTPServing
import ServerSupport
import Testing

@testable import TokenService

/// Issue 13, "Conditional GET": `ETag` on `GET`/`HEAD /token`, `If-None-Match` (RFC 9110
/// §13.1.2) and `304 Not Modified` (§15.4.5), through `IfNoneMatch` and `Responder`.
@Suite("Conditional GET")
struct ConditionalGETTests {
    static let current = EntityTag(opaqueTag: "abc123")!

    // MARK: If-None-Match parsing

    @Test(
        "If-None-Match that matches (weak comparison, lists, *)",
        arguments: [
            #""abc123""#, #"W/"abc123""#, #""x", "abc123""#, #""x",W/"abc123""#, #"  "abc123"  "#, "*", " * ",
            #","abc123","#, "\"x\" ,\t\"abc123\"", #", , "abc123""#, #""abc123", "x""#, #"W/"x", W/"abc123", "y""#,
        ])
    func matching(field: String) {
        #expect(IfNoneMatch.matches(field, current: Self.current))
    }

    @Test(
        "If-None-Match that does not match, or is garbled",
        arguments: [
            "", " ", ",", ", ,", #""abc12""#, #""abc1234""#, #""ABC123""#, "abc123", #"w/"abc123""#,
            #"W"abc123""#, #"W/ "abc123""#, #""abc123"#, #"abc123""#, #""abc123"junk"#, #""abc123" "x""#,
            #"*, "abc123""#, #""abc123", *"#, "**", #""abc 123""#, #""abc123"; "x""#, #""abc123", garbage"#,
            "\"abc\u{01}123\"", #"""#, #""x", "abc123"#,
        ])
    func notMatching(field: String) {
        #expect(!IfNoneMatch.matches(field, current: Self.current))
    }

    @Test("no If-None-Match field matches nothing")
    func absentField() {
        #expect(!IfNoneMatch.matches(nil as String?, current: Self.current))
    }

    @Test("a weak current tag matches its strong form too (weak comparison both ways)")
    func weakCurrent() {
        let weak = EntityTag(opaqueTag: "abc123", isWeak: true)!
        #expect(weak.fieldValue == #"W/"abc123""#)
        #expect(IfNoneMatch.matches(#""abc123""#, current: weak))
        #expect(IfNoneMatch.matches(#"W/"abc123""#, current: weak))
    }

    @Test("obs-text bytes are etagc: a tag with UTF-8 in it compares byte for byte")
    func obsText() {
        let tag = EntityTag(opaqueTag: "é")!
        #expect(IfNoneMatch.matches("\"é\"", current: tag))
        #expect(!IfNoneMatch.matches("\"e\"", current: tag))
    }

    // MARK: EntityTag

    @Test("an entity tag cannot hold a double quote, space, control character or DEL")
    func entityTagCharacters() {
        for bad in ["a\"b", "a b", "a\u{7f}", "\t", "a\u{00}"] {
            #expect(EntityTag(opaqueTag: bad) == nil, "\(bad.debugDescription)")
        }
        #expect(EntityTag(opaqueTag: "")?.fieldValue == #""""#)
        #expect(EntityTag(opaqueTag: "!#~")?.fieldValue == #""!#~""#)
    }

    @Test("the strong tag of a body: 32 hex digits of its SHA-256, quoted; the same body, the same tag")
    func strongTag() {
        let body = utf8(#"{"token":null}"#)
        let tag = EntityTag.strong(digesting: body)
        #expect(!tag.isWeak)
        #expect(tag.fieldValue == "\"" + lowerHex(Array(SHA256.digest(body).prefix(16))) + "\"")
        #expect(tag == EntityTag.strong(digesting: body))
        #expect(tag != EntityTag.strong(digesting: utf8(#"{"token":"00"}"#)))
    }

    @Test("the ETag of GET /token follows the token's value alone: the same across versions and restarts")
    func tagFollowsTheValue() {
        let token = "a1b2c3d4"
        #expect(TokenSnapshot(version: 0, token: token).entityTag == TokenSnapshot(version: 7, token: token).entityTag)
        #expect(TokenSnapshot(version: 3, token: nil).entityTag == TokenSnapshot(version: 0, token: nil).entityTag)
        #expect(TokenSnapshot(version: 1, token: token).entityTag != TokenSnapshot(version: 1, token: nil).entityTag)

        // Two services (a restart): the same token, different versions, the same tag.
        let first = makeResponder()
        let second = makeResponder()
        first.owner.register(deviceToken: [0xa1, 0xb2])
        second.owner.register(deviceToken: [0x00])
        second.owner.register(deviceToken: [0xa1, 0xb2])
        #expect(first.owner.current.version != second.owner.current.version)
        let one = try? first.send("GET", "/token")
        let two = try? second.send("GET", "/token")
        #expect(one?.headers["ETag"] != nil && one?.headers["ETag"] == two?.headers["ETag"])
    }

    // MARK: 304 through the responder

    @Test("GET and HEAD /token with the current ETag: 304, the ETag and Cache-Control, no Content-Type")
    func notModified() throws {
        let responder = makeResponder()
        responder.owner.register(deviceToken: [0xab, 0xcd])
        let full = try responder.send("GET", "/token")
        let etag = try #require(full.headers["ETag"])
        for method in ["GET", "HEAD"] {
            for field in [etag, "W/" + etag, "\"other\", " + etag, "*"] {
                let response = try responder.send(method, "/token", headers: ["If-None-Match": field])
                #expect(response.status == 304, "\(method) If-None-Match: \(field)")
                #expect(response.headers["ETag"] == etag)
                #expect(response.headers["Cache-Control"] == "no-cache")
                #expect(response.headers["Content-Type"] == nil)
                // Kept only for libmicrohttpd's Content-Length (never sent): the 200's length.
                #expect(response.body.count == full.body.count)
            }
        }
    }

    @Test("a changed token, another tag or a garbled field: the full 200")
    func modified() throws {
        let responder = makeResponder()
        responder.owner.register(deviceToken: [0xab, 0xcd])
        let old = try #require(try responder.send("GET", "/token").headers["ETag"])
        responder.owner.register(deviceToken: [0xef])
        for field in [old, "\"nope\"", "garbled", old + " junk", ""] {
            let response = try responder.send("GET", "/token", headers: ["If-None-Match": field])
            #expect(response.status == 200, "If-None-Match: \(field)")
            #expect(response.body == utf8(#"{"token":"ef"}"#))
            #expect(response.headers["ETag"] != old)
        }
    }

    @Test("with --auth-scope all, /token and the page are private, no-cache; the 304 needs the token too")
    func privateWhenReadsNeedTheToken() throws {
        let secret = "s3cret-token"
        let all = Responder(
            owner: makeOwner(maxSubscribers: 4),
            authentication: BearerAuthentication(token: secret, scope: .all))
        let bearer: HTTPHeaders = ["Authorization": "Bearer \(secret)"]
        let token = try all.send("GET", "/token", headers: bearer)
        #expect(token.headers["Cache-Control"] == "private, no-cache")
        let etag = try #require(token.headers["ETag"])
        var conditional = bearer
        conditional.add("If-None-Match", etag)
        let notModified = try all.send("GET", "/token", headers: conditional)
        #expect(notModified.status == 304 && notModified.headers["Cache-Control"] == "private, no-cache")
        #expect(try all.send("GET", "/token", headers: ["If-None-Match": etag]).status == 401)
        #expect(try all.send("GET", "/", headers: bearer).headers["Cache-Control"] == "private, no-cache")

        let writes = Responder(
            owner: makeOwner(maxSubscribers: 4),
            authentication: BearerAuthentication(token: secret, scope: .writes))
        #expect(try writes.send("GET", "/token").headers["Cache-Control"] == "no-cache")
        #expect(try writes.send("GET", "/").headers["Cache-Control"] == "no-cache")
    }

    @Test("CORS: responses expose ETag, a preflight allows If-None-Match, a 304 carries the CORS fields")
    func crossOrigin() throws {
        let origin = "https://app.example.com"
        let responder = Responder(
            owner: makeOwner(maxSubscribers: 4),
            crossOrigin: try CrossOriginPolicy(origins: [origin]))
        let full = try responder.sent("GET", "/token", headers: ["Origin": origin])
        #expect(full.headers["Access-Control-Expose-Headers"]?.contains("ETag") == true)
        let etag = try #require(full.headers["ETag"])
        let notModified = try responder.sent("GET", "/token", headers: ["Origin": origin, "If-None-Match": etag])
        #expect(notModified.status == 304)
        #expect(notModified.headers["Access-Control-Allow-Origin"] == origin)
        #expect(notModified.headers["Vary"] == "Origin")
        let preflight = try responder.sent(
            "OPTIONS", "/token",
            headers: [
                "Origin": origin, "Access-Control-Request-Method": "GET",
                "Access-Control-Request-Headers": "if-none-match",
            ])
        #expect(preflight.headers["Access-Control-Allow-Headers"]?.contains("If-None-Match") == true)
    }

    @Test("GET / with the page's ETag: 304 with its policy fields")
    func pageNotModified() throws {
        let responder = makeResponder()
        let page = try responder.send("GET", "/")
        let etag = try #require(page.headers["ETag"])
        #expect(etag == LivePage.entityTag.fieldValue)
        let response = try responder.send("GET", "/", headers: ["If-None-Match": etag])
        #expect(response.status == 304)
        #expect(response.headers["Content-Security-Policy"] == LivePage.contentSecurityPolicy)
        #expect(try responder.send("GET", "/", headers: ["If-None-Match": "\"stale\""]).status == 200)
    }
}

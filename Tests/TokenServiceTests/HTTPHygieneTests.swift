import ForgePushToken
import ForgePushTokenTestSupport
import Foundation
import HTTPServing
import ServerSupport
import Testing

@testable import TokenService

/// Issue 14: the header fields every answer carries, the cache policy of each route, the live
/// page's Content-Security-Policy, and the SHA-256 they rest on.
@Suite("HTTP hygiene")
struct HTTPHygieneTests {
    // MARK: SHA-256

    @Test("SHA-256 of the FIPS 180-4 examples")
    func fipsVectors() {
        #expect(
            lowerHex(SHA256.digest([UInt8]())) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        #expect(
            lowerHex(SHA256.digest(utf8("abc"))) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        #expect(
            lowerHex(SHA256.digest(utf8("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")))
                == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1")
        #expect(
            lowerHex(SHA256.digest(utf8(String(repeating: "a", count: 1000))))
                == "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3")
    }

    @Test("SHA-256 agrees with openssl dgst -sha256 at every length around the block boundaries")
    func agreesWithOpenSSL() throws {
        let openssl = "/usr/bin/openssl"
        try #require(FileManager.default.isExecutableFile(atPath: openssl), "openssl is needed for this check")
        for length in [1, 54, 55, 56, 57, 63, 64, 65, 119, 120, 127, 128, 129, 300] {
            let message = (0..<length).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) }
            let file = FileManager.default.temporaryDirectory.appendingPathComponent("sha256-\(length)-\(getpid()).bin")
            try Data(message).write(to: file)
            defer { try? FileManager.default.removeItem(at: file) }
            let output = try standardOutput(of: openssl, arguments: ["dgst", "-sha256", "-binary", file.path])
            #expect(Array(output) == SHA256.digest(message), "length \(length)")
        }
    }

    // MARK: Common header fields

    @Test("every answer gets nosniff, and no-store unless it names its own Cache-Control")
    func completing() {
        let plain = ResponseHeaders.completing(["Content-Type": "application/json"])
        #expect(plain.fields.map(\.name) == ["Content-Type", "X-Content-Type-Options", "Cache-Control"])
        #expect(plain["X-Content-Type-Options"] == "nosniff")
        #expect(plain["Cache-Control"] == "no-store")
        #expect(plain.fields.count == 3)

        let own = ResponseHeaders.completing(["cache-control": "no-cache", "x-content-type-options": "nosniff"])
        #expect(own.fields.map(\.name) == ["cache-control", "x-content-type-options"])
        #expect(own["Cache-Control"] == "no-cache")
    }

    @Test("the engine's walk over an answer's fields (forEachField) gives completing's fields, in order")
    func forEachFieldIsCompleting() throws {
        let policy = try CrossOriginPolicy(origins: ["https://app.example"])
        let inputs: [HTTPHeaders] = [
            [:], ["Content-Type": "application/json"], ["cache-control": "no-cache", "Vary": "Accept"],
            ["X-Content-Type-Options": "nosniff", "Cache-Control": "no-store", "ETag": "\"x\""],
        ]
        for headers in inputs {
            for (crossOrigin, origin) in [
                (CrossOriginPolicy(), nil), (CrossOriginPolicy(), "https://app.example"), (policy, nil),
                (policy, "https://app.example"), (policy, "https://other.example"),
            ] {
                var walked: [String] = []
                ResponseHeaders.forEachField(of: headers, crossOrigin: crossOrigin, origin: origin) {
                    walked.append("\($0): \($1)")
                }
                let completed = ResponseHeaders.completing(headers, crossOrigin: crossOrigin, origin: origin)
                #expect(walked == completed.fields.map { "\($0.name): \($0.value)" })
                #expect(walked.count >= headers.fields.count + (crossOrigin.isEnabled ? 1 : 0))
            }
        }
    }

    @Test(
        "each route names the cache policy it means",
        arguments: [
            ("GET", "/healthz", "no-store"), ("GET", "/metrics", "no-store"), ("GET", "/token", "no-cache"),
            ("HEAD", "/token", "no-cache"), ("GET", "/", "no-cache"), ("HEAD", "/", "no-cache"),
            ("GET", "/nope", "no-store"), ("DELETE", "/token", "no-store"), ("OPTIONS", "/token", "no-store"),
            ("POST", "/register", "no-store"), ("HEAD", "/token/stream", "no-cache, no-transform"),
        ])
    func cachePolicy(method: String, target: String, expected: String) throws {
        let response = try makeResponder().send(method, target, contentType: "text/plain", body: utf8("zz"))
        // What the engine sends: the responder's fields, completed in the one place.
        let sent = ResponseHeaders.completing(response.headers)
        #expect(sent["Cache-Control"] == expected)
        #expect(sent["X-Content-Type-Options"] == "nosniff")
        #expect(sent.filter { $0.name.lowercased() == "cache-control" }.count == 1)
    }

    @Test("the engine's own answers (413, 414, a framing refusal) are completed the same way")
    func engineAnswers() {
        for response in [EngineAnswers.payloadTooLarge(limit: 10), EngineAnswers.uriTooLong(limit: 10)] {
            let sent = ResponseHeaders.completing(response.headers)
            #expect(sent["Cache-Control"] == "no-store" && sent["X-Content-Type-Options"] == "nosniff")
        }
    }

    @Test("with CORS on, completing adds Vary to every answer, and the allow fields for an allowed Origin, once")
    func completingWithCrossOrigin() throws {
        let policy = try CrossOriginPolicy(origins: ["https://app.example"])
        let answers = [
            EngineAnswers.payloadTooLarge(limit: 10), EngineAnswers.uriTooLong(limit: 10),
            EngineAnswers.requestTimeout(seconds: 1, body: true), HTTPResponse.json(200, encoding: ["status": "ok"]),
        ]
        for response in answers {
            let allowed = ResponseHeaders.completing(
                response.headers, crossOrigin: policy, origin: "https://app.example")
            #expect(allowed["Access-Control-Allow-Origin"] == "https://app.example" && allowed["Vary"] == "Origin")
            #expect(allowed["Access-Control-Expose-Headers"] == CrossOriginPolicy.exposedHeaders)
            #expect(allowed["X-Content-Type-Options"] == "nosniff" && allowed["Cache-Control"] == "no-store")
            for origin in ["https://other.example", nil] {
                let other = ResponseHeaders.completing(response.headers, crossOrigin: policy, origin: origin)
                #expect(other["Access-Control-Allow-Origin"] == nil && other["Vary"] == "Origin")
            }
            let off = ResponseHeaders.completing(response.headers, origin: "https://app.example")
            #expect(off["Access-Control-Allow-Origin"] == nil && off["Vary"] == nil)
        }
        // A preflight answer names its own fields: they are not added twice.
        let preflight = policy.options(
            allowing: Route.token.allowedMethods,
            request: HTTPRequest(
                method: "OPTIONS", path: "/token", query: nil,
                headers: ["Origin": "https://app.example", "Access-Control-Request-Method": "GET"]))
        let sent = ResponseHeaders.completing(preflight.headers, crossOrigin: policy, origin: "https://app.example")
        #expect(sent.filter { $0.name == "Access-Control-Allow-Origin" }.count == 1)
        #expect(sent.filter { $0.name == "Vary" }.count == 1)
        // The 408 the engine writes itself is completed the same way.
        let timeout = String(
            decoding: EngineAnswers.requestTimeout(seconds: 1, body: true).closingMessage(
                reason: "Request Timeout", date: "Wed, 02 Dec 2026 13:00:00 GMT", crossOrigin: policy,
                origin: "https://app.example"), as: UTF8.self)
        #expect(timeout.contains("\r\nAccess-Control-Allow-Origin: https://app.example\r\n"))
        #expect(timeout.contains("\r\nVary: Origin\r\n"))
    }

    // MARK: The live page

    @Test("GET /: Content-Security-Policy, Referrer-Policy, no-cache and an ETag")
    func pageHeaders() throws {
        let page = try makeResponder().send("GET", "/")
        #expect(page.status == 200)
        #expect(page.headers["Content-Security-Policy"] == LivePage.contentSecurityPolicy)
        #expect(page.headers["Referrer-Policy"] == "no-referrer")
        #expect(page.headers["Cache-Control"] == "no-cache")
        #expect(page.headers["ETag"] == EntityTag.strong(digesting: LivePage.html).fieldValue)
        #expect(page.body == LivePage.html)
    }

    @Test("the policy: nothing by default, the page's own inline script and style by hash, the stream from self")
    func policyDirectives() {
        let directives = LivePage.contentSecurityPolicy.split(separator: ";").map {
            $0.trimmingCharacters(in: .whitespaces)
        }
        func sources(_ name: String) -> [String]? {
            directives.first { $0.hasPrefix(name + " ") }.map { $0.split(separator: " ").dropFirst().map(String.init) }
        }
        #expect(sources("default-src") == ["'none'"])
        #expect(sources("connect-src") == ["'self'"])
        #expect(sources("frame-ancestors") == ["'none'"])
        #expect(sources("base-uri") == ["'none'"])
        #expect(sources("form-action") == ["'none'"])
        #expect(!LivePage.contentSecurityPolicy.contains("unsafe"))

        // Each hash is the SHA-256 of the element's text, found here by plain string search.
        let html = String(decoding: LivePage.html, as: UTF8.self)
        for element in ["script", "style"] {
            let text = html.components(separatedBy: "<\(element)>").dropFirst()
                .map { $0.components(separatedBy: "</\(element)>")[0] }
            #expect(text.count == 1, "one inline \(element) element")
            let expected = text.map { "'sha256-" + Data(SHA256.digest(Array($0.utf8))).base64EncodedString() + "'" }
            #expect(sources("\(element)-src") == expected)
        }
    }

    @Test("the page uses nothing the policy would block: no inline handlers, style attributes or outside assets")
    func pageFitsThePolicy() {
        let html = String(decoding: LivePage.html, as: UTF8.self).lowercased()
        #expect(!html.contains(" style="))
        #expect(!html.contains("<script "))
        #expect(!html.contains("<style "))
        #expect(!html.contains("<link"))
        #expect(!html.contains("<img"))
        #expect(!html.contains("<iframe"))
        #expect(!html.contains("<form"))
        #expect(!html.contains("javascript:"))
        #expect(html.range(of: #"\son[a-z]+\s*="#, options: .regularExpression) == nil)
    }

    @Test("a hash source for each inline element, in order; none when there is none")
    func inlineHashSources() {
        let page = utf8("<style>a</style><script>b</script><script></script>")
        #expect(
            LivePage.inlineHashSources(element: "script", in: page) == [
                "'sha256-" + Data(SHA256.digest(utf8("b"))).base64EncodedString() + "'",
                "'sha256-47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU='",  // SHA-256 of nothing
            ])
        #expect(LivePage.inlineHashSources(element: "style", in: page).count == 1)
        #expect(LivePage.inlineHashSources(element: "style", in: utf8("<style>never closed")).isEmpty)
    }
}

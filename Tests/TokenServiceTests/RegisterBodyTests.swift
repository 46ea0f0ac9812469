import ForgePushToken
import ForgePushTokenOwner
import Foundation
import HTTPServing
import ServerSupport
import Testing

@testable import TokenService

/// One request body for `POST /register` or `POST /fail`.
struct BodyCase: Sendable, CustomTestStringConvertible {
    let name: String
    let contentType: String?
    let body: [UInt8]

    init(_ name: String, _ contentType: String?, _ body: [UInt8]) {
        self.name = name
        self.contentType = contentType
        self.body = body
    }

    init(_ name: String, _ contentType: String?, _ text: String) {
        self.init(name, contentType, utf8(text))
    }

    var testDescription: String { name }
}

/// `POST /register` through `Responder` (http-api.md, `POST /register`).
@Suite("POST /register bodies")
struct RegisterBodyTests {
    static let form = "application/x-www-form-urlencoded"
    static let json = "application/json"

    // MARK: application/octet-stream

    @Test("octet-stream: raw bytes, 1 to 256 of them", arguments: [1, 2, 32, 100, 255, 256])
    func octetStream(count: Int) throws {
        let responder = makeResponder()
        let bytes = tokenBytes(count, seed: 3)
        let response = try responder.send("POST", "/register", contentType: "application/octet-stream", body: bytes)
        try expectChange(response, token: lowerHex(bytes), changed: true)
        #expect(responder.owner.current == TokenSnapshot(version: 1, token: lowerHex(bytes)))
        #expect(responder.owner.current.token == lowerHex(bytes))
    }

    @Test(
        "octet-stream: the media type alone counts, case-insensitively",
        arguments: [
            "application/octet-stream", "Application/Octet-Stream", "APPLICATION/OCTET-STREAM",
            "application/octet-stream; charset=binary", " application/octet-stream ;x=y",
        ])
    func octetStreamMediaType(contentType: String) throws {
        let responder = makeResponder()
        // "ab" as raw bytes would be the hex "6162"; as hex text it would be the byte 0xab.
        let response = try responder.send("POST", "/register", contentType: contentType, body: utf8("ab"))
        try expectChange(response, token: "6162", changed: true)
    }

    @Test("octet-stream: bytes that look like whitespace or text are kept as they are")
    func octetStreamKeepsEveryByte() throws {
        let responder = makeResponder()
        let bytes: [UInt8] = [0x20, 0x0a, 0x00, 0xff, 0x3d, 0x0d]
        let response = try responder.send("POST", "/register", contentType: "application/octet-stream", body: bytes)
        try expectChange(response, token: "200a00ff3d0d", changed: true)
    }

    // MARK: application/json

    @Test(
        "JSON {\"deviceToken\":\"<hex>\"}",
        arguments: [
            "application/json", "Application/JSON; charset=utf-8", "APPLICATION/JSON",
            " application/json ; charset=UTF-8",
        ])
    func jsonBody(contentType: String) throws {
        let responder = makeResponder()
        let bytes = tokenBytes(32)
        let response = try responder.send(
            "POST", "/register", contentType: contentType,
            body: utf8(#"{"deviceToken":"\#(lowerHex(bytes))"}"#))
        try expectChange(response, token: lowerHex(bytes), changed: true)
        #expect(responder.owner.current.version == 1)
    }

    @Test("JSON: uppercase hex is stored lowercase; other members and whitespace are fine")
    func jsonUppercaseAndExtras() throws {
        let responder = makeResponder()
        let response = try responder.send(
            "POST", "/register", contentType: Self.json,
            body: utf8(" {\n \"app\": \"x\", \"deviceToken\" : \"ABCDEF0123\" , \"n\": [1] }\n"))
        try expectChange(response, token: "abcdef0123", changed: true)
    }

    @Test("JSON: 512 hex digits (256 bytes) are accepted")
    func jsonLongest() throws {
        let responder = makeResponder()
        let bytes = tokenBytes(256)
        let response = try responder.send(
            "POST", "/register", contentType: Self.json,
            body: utf8(#"{"deviceToken":"\#(lowerHex(bytes).uppercased())"}"#))
        try expectChange(response, token: lowerHex(bytes), changed: true)
    }

    // MARK: Hex text and forms

    @Test(
        "hex text: with no Content-Type, text/plain, or a form type",
        arguments: [
            nil, "text/plain", "text/plain; charset=utf-8", form, "application/x-www-form-urlencoded; charset=UTF-8",
            "application/x-anything",
        ] as [String?])
    func hexText(contentType: String?) throws {
        let responder = makeResponder()
        let response = try responder.send("POST", "/register", contentType: contentType, body: utf8("0a1b2c3d"))
        try expectChange(response, token: "0a1b2c3d", changed: true)
    }

    @Test(
        "hex text: ASCII whitespace at both ends is ignored, uppercase is stored lowercase",
        arguments: [
            BodyCase("uppercase", nil, "ABCDEF"),
            BodyCase("mixed case", nil, "AbCdEf"),
            BodyCase("trailing newline (curl -d @file)", nil, "abcdef\n"),
            BodyCase("CRLF", "text/plain", "abcdef\r\n"),
            BodyCase("spaces and tabs", "text/plain", " \t ABCDEF \t "),
            BodyCase("leading newlines", nil, "\n\n\r\nabcdef"),
            BodyCase("form feed", nil, "\u{0C}abcdef\u{0C}"),
            BodyCase("whitespace in a form value", form, "deviceToken=%20%0AABCDEF%0D%0A"),
            BodyCase("plus as space in a form value", form, "deviceToken=+abcdef+"),
        ])
    func hexTextWhitespace(_ input: BodyCase) throws {
        let responder = makeResponder()
        let response = try responder.send("POST", "/register", contentType: input.contentType, body: input.body)
        try expectChange(response, token: "abcdef", changed: true)
        #expect(responder.owner.current.token == "abcdef")
    }

    @Test("hex text: 2 and 512 digits are the limits", arguments: [2, 64, 510, 512])
    func hexTextLengths(digits: Int) throws {
        let responder = makeResponder()
        let bytes = tokenBytes(digits / 2, seed: 9)
        let response = try responder.send("POST", "/register", body: utf8(lowerHex(bytes)))
        try expectChange(response, token: lowerHex(bytes), changed: true)
    }

    @Test(
        "form field deviceToken=<hex>",
        arguments: [
            BodyCase("alone", form, "deviceToken=a1b2c3d4"),
            BodyCase("among other fields", form, "app=demo&deviceToken=a1b2c3d4&user=7"),
            BodyCase("last field", form, "a=1&b=&deviceToken=a1b2c3d4"),
            BodyCase("first of two", form, "deviceToken=a1b2c3d4&deviceToken=ffff"),
            BodyCase("percent-encoded value", form, "deviceToken=%61%31B2%43%33d4"),
            BodyCase("percent-encoded name", form, "device%54oken=A1B2C3D4"),
            BodyCase("other fields with encodings", form, "note=a%26b%3Dc+d&deviceToken=A1B2C3D4"),
            BodyCase("without Content-Type", nil, "deviceToken=a1b2c3d4"),
            BodyCase("text/plain", "text/plain", "deviceToken=a1b2c3d4\n"),
        ])
    func formField(_ input: BodyCase) throws {
        let responder = makeResponder()
        let response = try responder.send("POST", "/register", contentType: input.contentType, body: input.body)
        try expectChange(response, token: "a1b2c3d4", changed: true)
    }

    // MARK: changed

    @Test("changed is true for a new token, false for the same one in any form")
    func changedThenUnchanged() throws {
        let responder = makeResponder()
        try expectChange(try responder.send("POST", "/register", body: utf8("c0ffee")), token: "c0ffee", changed: true)
        #expect(responder.owner.current.version == 1)

        try expectChange(try responder.send("POST", "/register", body: utf8("c0ffee")), token: "c0ffee", changed: false)
        try expectChange(
            try responder.send("POST", "/register", body: utf8(" C0FFEE\n")), token: "c0ffee", changed: false)
        try expectChange(
            try responder.send(
                "POST", "/register", contentType: "application/octet-stream",
                body: [0xc0, 0xff, 0xee]), token: "c0ffee", changed: false)
        try expectChange(
            try responder.send(
                "POST", "/register", contentType: Self.json,
                body: utf8(#"{"deviceToken":"C0ffEE"}"#)), token: "c0ffee", changed: false)
        try expectChange(
            try responder.send(
                "POST", "/register", contentType: Self.form,
                body: utf8("deviceToken=c0ffee")), token: "c0ffee", changed: false)
        #expect(responder.owner.current == TokenSnapshot(version: 1, token: "c0ffee"))

        try expectChange(try responder.send("POST", "/register", body: utf8("c0ffef")), token: "c0ffef", changed: true)
        #expect(responder.owner.current.version == 2)
    }

    // MARK: Rejections

    static let longHex = String(repeating: "ab", count: 257)  // 514 digits

    static let rejected: [BodyCase] = [
        BodyCase("empty, no Content-Type", nil, []),
        BodyCase("empty text/plain", "text/plain", []),
        BodyCase("empty form", form, []),
        BodyCase("whitespace only", nil, " \t\r\n"),
        BodyCase("one digit", nil, "a"),
        BodyCase("odd length", nil, "abc"),
        BodyCase("odd length with whitespace", nil, " abcde \n"),
        BodyCase("non-hex", nil, "zz"),
        BodyCase("non-hex digit", nil, "abcg"),
        BodyCase("0x prefix", nil, "0xabcd"),
        BodyCase("inner space", nil, "ab cd"),
        BodyCase("colon separated", "text/plain", "ab:cd:ef"),
        BodyCase("angle brackets (Data.description)", nil, "<abcd ef01>"),
        BodyCase("non-ASCII digits", nil, "ａｂ"),
        BodyCase("514 digits", nil, longHex),
        BodyCase("513 digits", nil, String(longHex.dropLast())),
        BodyCase("514 digits as form", form, "deviceToken=" + longHex),
        BodyCase("non-UTF-8 text", "text/plain", [0xff, 0xfe, 0x41, 0x42]),
        BodyCase("non-UTF-8 without Content-Type", nil, [0xab, 0xcd, 0xef, 0x80]),
        BodyCase("octet-stream empty", "application/octet-stream", []),
        BodyCase("octet-stream 257 bytes", "application/octet-stream", tokenBytes(257)),
        BodyCase("octet-stream 4096 bytes", "application/octet-stream", tokenBytes(4096)),
        BodyCase("malformed JSON", json, #"{"deviceToken":"#),
        BodyCase("malformed JSON, single quotes", json, "{'deviceToken':'abcd'}"),
        BodyCase("JSON empty body", json, []),
        BodyCase("JSON missing field", json, "{}"),
        BodyCase("JSON {\"token\":…}", json, #"{"token":"abcd"}"#),
        BodyCase("JSON field name case", json, #"{"devicetoken":"abcd"}"#),
        BodyCase("JSON array", json, #"["abcd"]"#),
        BodyCase("JSON array of the object", json, #"[{"deviceToken":"abcd"}]"#),
        BodyCase("JSON string", json, #""abcd""#),
        BodyCase("JSON number field", json, #"{"deviceToken":1234}"#),
        BodyCase("JSON null field", json, #"{"deviceToken":null}"#),
        BodyCase("JSON empty string", json, #"{"deviceToken":""}"#),
        BodyCase("JSON odd hex", json, #"{"deviceToken":"abc"}"#),
        BodyCase("JSON non-hex", json, #"{"deviceToken":"xyz0"}"#),
        BodyCase("JSON 514 digits", json, #"{"deviceToken":"\#(longHex)"}"#),
        BodyCase("JSON content type with bare hex", "application/json; charset=utf-8", "abcd"),
        BodyCase("JSON with trailing garbage", json, #"{"deviceToken":"abcd"} x"#),
        BodyCase("two JSON objects", json, #"{"deviceToken":"abcd"}{"deviceToken":"ef01"}"#),
        BodyCase("JSON with a comment", json, #"{"deviceToken":"abcd" /* c */}"#),
        BodyCase("JSON5 unquoted key", json, #"{deviceToken:"abcd"}"#),
        BodyCase(
            "JSON nested 2000 deep", json, String(repeating: "[", count: 2000) + String(repeating: "]", count: 2000)),
        BodyCase("no-break spaces around hex", nil, "\u{A0}abcd\u{A0}"),
        BodyCase("form without the field", form, "a=1&b=2"),
        BodyCase("form with an empty value", form, "deviceToken="),
        BodyCase("form with the name only", form, "deviceToken"),
        BodyCase("form with an odd value", form, "deviceToken=abc"),
        BodyCase("form with a broken escape", form, "deviceToken=%zzabcd"),
        BodyCase("form with a truncated escape", form, "deviceToken=abcd%4"),
        BodyCase(
            "multipart/form-data", "multipart/form-data; boundary=XyZ",
            "--XyZ\r\nContent-Disposition: form-data; name=\"deviceToken\"\r\n\r\nabcd\r\n--XyZ--\r\n"),
    ]

    @Test("400 invalid_token, state unchanged", arguments: rejected)
    func rejectedBody(_ input: BodyCase) throws {
        // Once from the initial state, once with a token set.
        for initial in [nil, [0x12, 0x34] as [UInt8]] {
            let responder = makeResponder()
            if let initial { _ = responder.owner.register(deviceToken: initial) }
            let before = responder.owner.current
            let response = try responder.send("POST", "/register", contentType: input.contentType, body: input.body)
            try expectError(response, status: 400, code: "invalid_token")
            #expect(responder.owner.current == before)
            #expect(responder.owner.current.version == before.version)
            #expect(responder.owner.current.token == before.token)
        }
    }

    @Test(
        "multipart/form-data: the message says to use -d or --data-binary",
        arguments: [
            "multipart/form-data; boundary=----x", "Multipart/Form-Data", "multipart/form-data",
        ])
    func multipartHint(contentType: String) throws {
        let responder = makeResponder()
        let response = try responder.send(
            "POST", "/register", contentType: contentType,
            body: utf8("------x\r\nContent-Disposition: form-data; name=\"deviceToken\"\r\n\r\nabcd\r\n------x--\r\n"))
        let message = try expectError(response, status: 400, code: "invalid_token")
        #expect(message.contains("-d") || message.contains("--data-binary"), "message: \(message)")
        #expect(responder.owner.current.version == 0)
    }

    @Test(
        "a form whose deviceToken value cannot be decoded is not said to lack the field",
        arguments: ["deviceToken=%zz", "deviceToken=ab%4", "deviceToken=%ff%fe"])
    func undecodableFormValueMessage(body: String) throws {
        let responder = makeResponder()
        let response = try responder.send("POST", "/register", contentType: Self.form, body: utf8(body))
        let message = try expectError(response, status: 400, code: "invalid_token")
        #expect(responder.owner.current.version == 0)
        #expect(!message.contains("no deviceToken field"), "message: \(message)")
        #expect(message.contains("percent-encoded"), "message: \(message)")
    }

    // MARK: RequestBodies directly

    @Test("mediaType: the part before ;, trimmed and lowercased")
    func mediaType() {
        #expect(RequestBodies.mediaType(nil) == nil)
        #expect(RequestBodies.mediaType("") == "")
        #expect(RequestBodies.mediaType("Application/JSON; charset=utf-8") == "application/json")
        #expect(RequestBodies.mediaType("  text/plain  ") == "text/plain")
        #expect(RequestBodies.mediaType("multipart/form-data;boundary=a;b=c") == "multipart/form-data")
        #expect(RequestBodies.mediaType(";charset=utf-8") == "")
    }

    @Test("deviceTokenHex(contentType:body:) returns the token's lowercase hex")
    func deviceTokenHexText() throws {
        #expect(try RequestBodies.deviceTokenHex(contentType: nil, body: utf8("00FFa0")) == "00ffa0")
        #expect(try RequestBodies.deviceTokenHex(contentType: "application/octet-stream", body: [7]) == "07")
        #expect(
            try RequestBodies.deviceTokenHex(
                contentType: "application/json",
                body: utf8(#"{"deviceToken":"0102"}"#)) == "0102")
        #expect(throws: ServiceError.self) {
            try RequestBodies.deviceTokenHex(contentType: nil, body: [])
        }
    }

    // MARK: the hex text the service keeps

    @Test(
        "deviceTokenHex's plain-hex fast path gives what the general path gives, or leaves the body to it",
        arguments: [
            BodyCase("plain hex", nil, "0aF9"), BodyCase("padded hex", "text/plain", " \tABcd\r\n"),
            BodyCase("octet-stream", "application/octet-stream", "ab"),
            BodyCase("json", "application/json", #"{"deviceToken":"ABcd"}"#),
            BodyCase("form", "application/x-www-form-urlencoded", "deviceToken=ABcd"),
            BodyCase("odd", nil, "abc"), BodyCase("not hex", nil, "zz"), BodyCase("empty", nil, ""),
            BodyCase("too long", nil, String(repeating: "ab", count: 257)),
            BodyCase("multipart", "multipart/form-data; boundary=x", "ab"),
            BodyCase("not UTF-8", nil, [0xff, 0xfe]), BodyCase("whitespace only", nil, " \r\n\t"),
            BodyCase("512 digits", nil, String(repeating: "Ab", count: 256)),
            BodyCase("513 digits", nil, String(repeating: "a", count: 513)),
            BodyCase("uppercase form", "application/x-www-form-urlencoded", "deviceToken=ABCD"),
            BodyCase("octet-stream of hex digits", "application/octet-stream", "ABCD"),
        ])
    func fastPathMatchesGeneralPath(_ body: BodyCase) {
        let text = Result { () throws(ServiceError) in
            try RequestBodies.deviceTokenHex(contentType: body.contentType, body: body.body)
        }
        // The general path for hex text: decoded to bytes, encoded again.
        let general = Result { () throws(ServiceError) in
            DeviceTokenHex.encode(try RequestBodies.hexToken(Substring(String(decoding: body.body, as: UTF8.self))))
        }
        guard let fast = RequestBodies.plainHexText(body.body) else {
            // Not plain hex text: the general path decides, so a text body it accepts is a form
            // (or another media type), never plain hex the fast path missed.
            if case .success = general, RequestBodies.mediaType(body.contentType) == nil {
                Issue.record("the fast path refused hex text the general path accepts: \(general)")
            }
            return
        }
        #expect(general == .success(fast))
        switch RequestBodies.mediaType(body.contentType) {
        case "application/json", "application/octet-stream", "multipart/form-data":
            break  // decoded their own way: the fast path is not tried
        default:
            #expect(text == .success(fast), "deviceTokenHex gave \(text), the fast path \(fast)")
        }
    }
}

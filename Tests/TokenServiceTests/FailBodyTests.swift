import ForgePushToken
import ForgePushTokenOwner
import ForgePushTokenTestSupport
import Foundation
import HTTPServing
import ServerSupport
import Testing

@testable import TokenService

/// `POST /fail` through `Responder` (http-api.md, `POST /fail`).
@Suite("POST /fail bodies")
struct FailBodyTests {
    static let json = "application/json"

    /// A responder with a token set (version 1) and a recorder of the manager's log.
    func setUp() throws -> (Responder, LogRecorder) {
        let recorder = LogRecorder()
        let responder = makeResponder(log: recorder.handler)
        try expectChange(
            try responder.send("POST", "/register", body: utf8("aabbccdd")), token: "aabbccdd", changed: true)
        return (responder, recorder)
    }

    struct Accepted: Sendable, CustomTestStringConvertible {
        let name: String
        let contentType: String?
        let body: [UInt8]
        /// The description of the error the manager receives (and logs).
        let description: String
        var testDescription: String { name }
    }

    static let accepted: [Accepted] = [
        Accepted(
            name: "text message", contentType: "text/plain", body: utf8("no valid aps-environment entitlement"),
            description: "no valid aps-environment entitlement"),
        Accepted(name: "text without Content-Type", contentType: nil, body: utf8("boom"), description: "boom"),
        Accepted(
            name: "form type: the text as it is", contentType: "application/x-www-form-urlencoded",
            body: utf8("message=a+b"), description: "message=a+b"),
        Accepted(
            name: "UTF-8 text", contentType: "text/plain; charset=utf-8", body: utf8("échec ✗"),
            description: "échec ✗"),
        Accepted(name: "empty body", contentType: nil, body: [], description: "unknown error"),
        Accepted(name: "empty text/plain", contentType: "text/plain", body: [], description: "unknown error"),
        Accepted(name: "JSON message", contentType: json, body: utf8(#"{"message":"m"}"#), description: "m"),
        Accepted(
            name: "JSON message, domain, code", contentType: json,
            body: utf8(#"{"message":"not supported in the simulator","domain":"NSCocoaErrorDomain","code":3010}"#),
            description: "NSCocoaErrorDomain 3010: not supported in the simulator"),
        Accepted(
            name: "JSON domain only", contentType: json, body: utf8(#"{"domain":"D","message":"m"}"#),
            description: "D: m"),
        Accepted(
            name: "JSON code only, negative", contentType: json, body: utf8(#"{"code":-1,"message":"m"}"#),
            description: "code -1: m"),
        Accepted(
            name: "JSON nulls for the optional members", contentType: json,
            body: utf8(#"{"message":"m","domain":null,"code":null}"#), description: "m"),
        Accepted(
            name: "JSON other members ignored", contentType: json,
            body: utf8(#"{"message":"m","userInfo":{"k":[1,2,{"x":null}]},"extra":true,"code":7}"#),
            description: "code 7: m"),
        Accepted(
            name: "JSON with charset, any case", contentType: "Application/JSON; charset=utf-8",
            body: utf8(#"{"message":"m","domain":"D","code":1}"#), description: "D 1: m"),
    ]

    @Test("accepted bodies clear the token and reach the manager", arguments: accepted)
    func acceptedBody(_ input: Accepted) throws {
        let (responder, recorder) = try setUp()
        let response = try responder.send("POST", "/fail", contentType: input.contentType, body: input.body)
        try expectChange(response, token: nil, changed: true)
        #expect(responder.owner.current == TokenSnapshot(version: 2, token: nil))
        #expect(responder.owner.current.token == nil)
        #expect(
            recorder.recorded.last
                == LogRecorder.Entry(
                    level: .error,
                    message: "registration failed: \(input.description)"))
    }

    @Test("changed is true only when a token was cleared")
    func changedOnlyWhenCleared() throws {
        let recorder = LogRecorder()
        let responder = makeResponder(log: recorder.handler)

        // No token: nothing to clear.
        try expectChange(try responder.send("POST", "/fail", body: utf8("first")), token: nil, changed: false)
        #expect(responder.owner.current == TokenSnapshot(version: 0, token: nil))

        _ = try responder.send("POST", "/register", body: utf8("0102"))
        try expectChange(
            try responder.send("POST", "/fail", contentType: Self.json, body: utf8(#"{"message":"x"}"#)),
            token: nil, changed: true)
        #expect(responder.owner.current == TokenSnapshot(version: 2, token: nil))

        try expectChange(try responder.send("POST", "/fail"), token: nil, changed: false)
        #expect(responder.owner.current == TokenSnapshot(version: 2, token: nil))

        // Every accepted /fail is logged, cleared or not.
        #expect(recorder.recorded.filter { $0.message.hasPrefix("registration failed: ") }.count == 3)
    }

    static let rejected: [BodyCase] = [
        BodyCase("malformed JSON {oops", json, "{oops"),
        BodyCase("JSON {}", json, "{}"),
        BodyCase("JSON []", json, "[]"),
        BodyCase("JSON array of the object", json, #"[{"message":"x"}]"#),
        BodyCase("JSON string", json, #""x""#),
        BodyCase("JSON null", json, "null"),
        BodyCase("JSON code as a string", json, #"{"message":"x","code":"3010"}"#),
        BodyCase("JSON message as a number", json, #"{"message":7}"#),
        BodyCase("JSON message null", json, #"{"message":null}"#),
        BodyCase("JSON code 1.5", json, #"{"message":"x","code":1.5}"#),
        BodyCase("JSON code true", json, #"{"message":"x","code":true}"#),
        BodyCase("JSON code too big", json, #"{"message":"x","code":1e40}"#),
        BodyCase("JSON domain as a number", json, #"{"message":"x","domain":5}"#),
        BodyCase("JSON without message", json, #"{"domain":"D","code":1}"#),
        BodyCase("JSON truncated", json, #"{"message":"x""#),
        BodyCase("JSON with charset, malformed", "Application/JSON; charset=utf-8", "{oops"),
        BodyCase("JSON type, plain text", json, "boom"),
        BodyCase("JSON with trailing garbage", json, #"{"message":"x"} y"#),
        BodyCase(
            "JSON nested 2000 deep", json, String(repeating: "[", count: 2000) + String(repeating: "]", count: 2000)),
        BodyCase("non-UTF-8 text", "text/plain", [0xc3, 0x28, 0x41]),
        BodyCase("non-UTF-8 without Content-Type", nil, [0xff, 0xfe, 0xfd]),
        BodyCase("non-UTF-8 form", "application/x-www-form-urlencoded", [0x80]),
        BodyCase(
            "JSON with invalid UTF-8", json,
            [
                0x7b, 0x22, 0x6d, 0x65, 0x73, 0x73, 0x61, 0x67, 0x65,
                0x22, 0x3a, 0x22, 0xff, 0x22, 0x7d,
            ]),
    ]

    @Test("400 invalid_request, state unchanged, nothing reaches the manager", arguments: rejected)
    func rejectedBody(_ input: BodyCase) throws {
        let (responder, recorder) = try setUp()
        let logged = recorder.recorded.count
        let response = try responder.send("POST", "/fail", contentType: input.contentType, body: input.body)
        try expectError(response, status: 400, code: "invalid_request")
        #expect(responder.owner.current == TokenSnapshot(version: 1, token: "aabbccdd"))
        #expect(responder.owner.current.token == "aabbccdd")
        #expect(recorder.recorded.count == logged, "a rejected /fail must not reach the manager")
    }

    @Test("registrationFailure(contentType:body:) decodes the members")
    func registrationFailureValues() throws {
        #expect(
            try RequestBodies.registrationFailure(
                contentType: "application/json",
                body: utf8(#"{"message":"m","domain":"D","code":3}"#))
                == RegistrationFailure(message: "m", domain: "D", code: 3))
        #expect(
            try RequestBodies.registrationFailure(contentType: nil, body: [])
                == RegistrationFailure(message: "unknown error"))
        #expect(
            try RequestBodies.registrationFailure(contentType: "text/plain", body: utf8(" x \n"))
                == RegistrationFailure(message: " x \n"))
    }

    @Test("RegistrationFailure.description mirrors NSError's domain, code and message")
    func registrationFailureDescription() {
        #expect(RegistrationFailure(message: "m").description == "m")
        #expect(RegistrationFailure(message: "m", domain: "D").description == "D: m")
        #expect(RegistrationFailure(message: "m", code: 5).description == "code 5: m")
        #expect(RegistrationFailure(message: "m", domain: "D", code: 5).description == "D 5: m")
    }

    @Test(
        "an empty body is \"unknown error\" whatever its Content-Type: the body is optional",
        arguments: [nil, "application/json", "text/plain"] as [String?])
    func emptyBodyIsUnknownError(contentType: String?) throws {
        let failure = try RequestBodies.registrationFailure(contentType: contentType, body: [])
        #expect(failure == RegistrationFailure(message: "unknown error"))
    }
}

import ForgePushToken
import ForgePushTokenOwner
import Foundation
import HTTPServing
import Testing

@testable import ServerSupport
@testable import TokenService

/// `JSONText`, the service's one JSON string escaper, and its two callers: the bodies and SSE
/// events (`TokenSnapshot`) and the JSON log lines (`JSONLine`). U+2028 and U+2029 come out as
/// `\u2028` and `\u2029` through both.
@Suite("JSONText: the one JSON string escaper")
struct JSONTextTests {
    static func escaped(_ value: String?) -> String {
        var out: [UInt8] = []
        JSONText.append(value, to: &out)
        return String(decoding: out, as: UTF8.self)
    }

    /// The string a JSON parser reads back from `literal` (a JSON string literal).
    static func decoded(_ literal: String) throws -> String {
        let value = try JSONSerialization.jsonObject(with: Data("[\(literal)]".utf8)) as? [String]
        return try #require(value?.first)
    }

    @Test(
        "every string comes back unchanged from a JSON parser, and no raw control, U+2028 or U+2029 is left",
        arguments: [
            "", "ab01", "a\"b", "back\\slash", "two\nlines", "cr\r\nlf", "\u{1B}[31m", "nul\u{0}byte", "tab\t",
            "\u{8}\u{C}\u{1F}", "/path/", "\u{2028}", "\u{2029}", "x\u{2028}y\u{2029}z", "\u{2028}\u{2028}",
            "trailing \u{2029}", "euro € ellipsis … en dash – (E2-led, kept raw)", "emoji 🎉 é", "del\u{7F}",
        ])
    func roundTrip(_ value: String) throws {
        let literal = Self.escaped(value)
        #expect(literal.hasPrefix("\"") && literal.hasSuffix("\""))
        #expect(!literal.unicodeScalars.contains { $0.value < 0x20 || $0.value == 0x2028 || $0.value == 0x2029 })
        #expect(try Self.decoded(literal) == value)
    }

    @Test("each character that must be escaped is escaped alone, first, last and between plain ones")
    func everyEscapeAlone() throws {
        // Never raw: the C0 controls and the two separators.
        let neverRaw = (0..<0x20).map { Character(Unicode.Scalar(UInt8($0))) } + ["\u{2028}", "\u{2029}"]
        for character in neverRaw {
            for value in [String(character), "\(character)ab", "ab\(character)", "a\(character)b"] {
                let literal = Self.escaped(value)
                #expect(!literal.contains(character), "\(value.unicodeScalars.map(\.value))")
                #expect(try Self.decoded(literal) == value)
            }
        }
        // Quote and backslash: preceded by a backslash.
        #expect(Self.escaped("\"") == #""\"""#)
        #expect(Self.escaped("\\") == #""\\""#)
        #expect(Self.escaped("a\"") == #""a\"""#)
        #expect(Self.escaped("\\b") == #""\\b""#)
        for plain in ["ab01", "/", "~", "€", "é", "\u{7F}", " "] {
            #expect(Self.escaped(plain) == "\"" + plain + "\"")
        }
    }

    @Test("U+2028 and U+2029 are written as \\u2028 and \\u2029; other E2-led characters stay raw")
    func separators() {
        #expect(Self.escaped("a\u{2028}b\u{2029}c") == #""a\u2028b\u2029c""#)
        #expect(Self.escaped("€…–") == "\"€…–\"")
        #expect(Self.escaped("\"\\\n") == #""\"\\\n""#)
        #expect(Self.escaped(nil) == "null")
    }

    @Test("through the bodies and the SSE event: U+2028 and U+2029 escaped, one data line")
    func throughTokenSnapshot() throws {
        let token = "ab\u{2028}cd\u{2029}"
        let snapshot = TokenSnapshot(version: 7, token: token)
        let body = String(decoding: snapshot.tokenBody, as: UTF8.self)
        #expect(body == #"{"token":"ab\u2028cd\u2029"}"#)
        let object = try JSONSerialization.jsonObject(with: Data(snapshot.tokenBody)) as? [String: String]
        #expect(object?["token"] == token)
        let event = String(decoding: snapshot.event, as: UTF8.self)
        #expect(event == "id: 7\nevent: token\ndata: " + body + "\n\n")
        // A reader that splits on every Unicode line break still sees the event's three lines.
        #expect(event.split(whereSeparator: \.isNewline).count == 3)
        let change = String(decoding: TokenSnapshot.changeBody(snapshot.state, changed: true), as: UTF8.self)
        #expect(change == #"{"changed":true,"token":"ab\u2028cd\u2029"}"#)
    }

    @Test("through the JSON log: U+2028 and U+2029 escaped, one line, the message unchanged")
    func throughLog() throws {
        let message = "forged\u{2028}INFO next\u{2029}line"
        let line = JSONLine.line(level: .error, message: message, time: "t")
        #expect(line == #"{"time":"t","level":"ERROR","msg":"forged\u2028INFO next\u2029line"}"# + "\n")
        #expect(line.split(whereSeparator: \.isNewline).count == 1)
        let object = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: String]
        #expect(object?["msg"] == message)
    }

    @Test("the eight-bytes-at-a-time scan finds every byte that needs escaping, at every place in a word")
    func wordScan() {
        // Every byte value, alone and among plain ones, at each offset of strings of 0 to 24
        // bytes: the scan must say what the byte-wise test says.
        let plain = UInt8(ascii: "a")
        for length in 0...24 {
            #expect(!anyNeedsEscaping(bytes: [UInt8](repeating: plain, count: length)))
            for offset in 0..<length {
                for value in 0...255 {
                    var bytes = [UInt8](repeating: plain, count: length)
                    bytes[offset] = UInt8(value)
                    let expected = needsEscaping(UInt8(value))
                    if anyNeedsEscaping(bytes: bytes) != expected {
                        Issue.record("byte \(value) at \(offset) of \(length): not \(expected)")
                        return
                    }
                }
            }
        }
        // Bytes just above the bounds beside ones just below, which a borrow could confuse.
        var generator = SystemRandomNumberGenerator()
        let edges: [UInt8] = [
            0x1F, 0x20, 0x21, 0x22, 0x23, 0x5B, 0x5C, 0x5D, 0xE1, 0xE2, 0xE3, 0x7F, 0x80, 0xFF, 0x00, 0x01,
        ]
        for _ in 0..<20_000 {
            let bytes = (0..<Int.random(in: 0...40, using: &generator)).map { _ in
                Bool.random(using: &generator) ? edges.randomElement(using: &generator)! : UInt8.random(in: 0x23...0x5B)
            }
            #expect(anyNeedsEscaping(bytes: bytes) == bytes.contains(where: needsEscaping), "\(bytes)")
        }
    }

    func anyNeedsEscaping(bytes: [UInt8]) -> Bool {
        bytes.withUnsafeBytes { ServerSupport.anyNeedsEscaping($0) }
    }
}

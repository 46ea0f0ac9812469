import ForgePushToken
import Foundation
import HTTPServing
import ServerSupport
import Testing

@testable import TokenService

/// `--log-format json`: one object per line with the field names of Go's log/slog JSON handler.
@Suite("ServerLog, JSON format")
struct JSONLogTests {
    /// Every line written, each parsed as one JSON object.
    static func objects(_ lines: ServerLogTests.Lines) throws -> [[String: Any]] {
        try lines.all.map { line in
            #expect(
                line.hasSuffix("}\n") && line.dropLast().firstIndex(of: "\n") == nil,
                "not one line: \(line.debugDescription)")
            let object = try JSONSerialization.jsonObject(with: Data(line.utf8))
            return try #require(object as? [String: Any])
        }
    }

    @Test("time (RFC 3339 UTC), level in slog's names, msg, and nothing else")
    func messageLines() throws {
        let lines = ServerLogTests.Lines()
        let log = ServerLog(minimumLevel: .debug, format: .json, sink: lines.sink)
        let before = Date.now
        for level in [ServerLogLevel.debug, .info, .warning, .error] { log.log(level, "m-\(level)") }
        let parsed = try Self.objects(lines)
        #expect(parsed.map { $0["level"] as? String } == ["DEBUG", "INFO", "WARN", "ERROR"])
        #expect(parsed.map { $0["msg"] as? String } == ["m-debug", "m-info", "m-warning", "m-error"])
        for object in parsed {
            #expect(Set(object.keys) == ["time", "level", "msg"])
            let stamp = try #require(object["time"] as? String)
            #expect(stamp.hasSuffix("Z"))
            let date = try Date.ISO8601FormatStyle(includingFractionalSeconds: true).parse(stamp)
            #expect(abs(date.timeIntervalSince(before)) < 5)
        }
        // The first three fields come first, in slog's order.
        #expect(lines.all[0].hasPrefix("{\"time\":\""))
        #expect(lines.all[0].contains("\",\"level\":\"DEBUG\",\"msg\":\"m-debug\"}"))
    }

    @Test("the minimum level still filters")
    func filters() throws {
        let lines = ServerLogTests.Lines()
        let log = ServerLog(minimumLevel: .warning, format: .json, sink: lines.sink)
        log.log(.info, "no")
        log.access(method: "GET", path: "/token", status: 200, bytes: 1, durationMicros: 1, remote: nil)
        log.log(.error, "yes")
        #expect(try Self.objects(lines).map { $0["msg"] as? String } == ["yes"])
    }

    @Test(
        "quotes, backslashes, line breaks and control characters are escaped: one valid line",
        arguments: [
            "a\"b", "back\\slash", "two\nlines", "cr\r\nlf", "\u{1B}[31mred\u{1B}[0m", "nul\u{0}byte", "tab\there",
            "del\u{7F}", "c1\u{85}\u{9B}31m", "emoji 🎉 é", "\u{2028}separator", "{\"injected\":1}",
            "plain ASCII /token/stream?x=1&y=[2] {} ~", "", "trailing backslash \\",
        ])
    func escaping(_ message: String) throws {
        let lines = ServerLogTests.Lines()
        let log = ServerLog(format: .json, sink: lines.sink)
        log.log(.error, message)
        let line = try #require(lines.all.first)
        // No raw control character survives (C0, DEL, C1), nor a Unicode line or paragraph
        // separator: a terminal or a pipeline that splits on line breaks sees one line of text.
        #expect(
            !line.dropLast().unicodeScalars.contains {
                $0.value < 0x20 || (0x7F...0x9F).contains($0.value) || $0.value == 0x2028 || $0.value == 0x2029
            })
        let parsed = try #require(try Self.objects(lines).first)
        let msg = try #require(parsed["msg"] as? String)
        // What JSON can carry comes back unchanged; DEL and C1 come back as \u{…} text.
        let expected = message.unicodeScalars.map {
            (0x7F...0x9F).contains($0.value) ? "\\u{\(String($0.value, radix: 16))}" : String($0)
        }.joined()
        #expect(msg == expected)
    }

    @Test("an access line adds method, path, status, bytes, duration_us and remote")
    func accessLine() throws {
        let lines = ServerLogTests.Lines()
        let log = ServerLog(format: .json, sink: lines.sink)
        log.access(
            method: "POST", path: "/register", status: 200, bytes: 31, durationMicros: 1234, remote: "[::1]:5000")
        log.access(method: "GET", path: "/token/stream", status: nil, bytes: 0, durationMicros: 7, remote: nil)
        let parsed = try Self.objects(lines)
        #expect(parsed[0]["level"] as? String == "INFO")
        #expect(parsed[0]["msg"] as? String == "POST /register")
        #expect(parsed[0]["method"] as? String == "POST")
        #expect(parsed[0]["path"] as? String == "/register")
        #expect(parsed[0]["status"] as? Int == 200)
        #expect(parsed[0]["bytes"] as? Int == 31)
        #expect(parsed[0]["duration_us"] as? Int == 1234)
        #expect(parsed[0]["remote"] as? String == "[::1]:5000")
        // No status sent, no peer known: the fields are left out rather than invented.
        #expect(parsed[1]["status"] == nil && parsed[1]["remote"] == nil)
        #expect(parsed[1]["bytes"] as? Int == 0)
    }

    @Test("lines logged from many threads at once are each whole and valid")
    func concurrentLines() throws {
        let lines = ServerLogTests.Lines()
        let log = ServerLog(format: .json, sink: lines.sink)
        DispatchQueue.concurrentPerform(iterations: 8) { thread in
            for index in 0..<100 {
                if index.isMultiple(of: 2) {
                    log.log(.warning, "thread \(thread) line \(index) \"quoted\"\n")
                } else {
                    log.access(
                        method: "GET", path: "/token", status: 200, bytes: index, durationMicros: 1,
                        remote: "127.0.0.1:\(thread)")
                }
            }
        }
        let parsed = try Self.objects(lines)
        #expect(parsed.count == 800)
        #expect(parsed.filter { $0["method"] != nil }.count == 400)
    }

    @Test("the text format's access line is unchanged, without the peer")
    func textAccessLine() throws {
        let lines = ServerLogTests.Lines()
        let log = ServerLog(format: .text, sink: lines.sink)
        log.access(method: "GET", path: "/token", status: 200, bytes: 57, durationMicros: 41, remote: "127.0.0.1:1")
        log.access(method: "GET", path: "/token/stream", status: nil, bytes: 9, durationMicros: 3, remote: nil)
        let messages = try lines.all.map { try ServerLogTests.parse($0).2 }
        #expect(messages == ["GET /token 200 57 bytes 41 us", "GET /token/stream - 9 bytes 3 us"])
    }
}

import ForgePushToken
import ForgePushTokenTestSupport
import Foundation
import HTTPServing
import ServerSupport
import Testing

@testable import TokenService

/// The service's log lines (http-api.md, "Command line": one line each, with a timestamp and level).
@Suite("ServerLog")
struct ServerLogTests {
    /// Collects the lines given to a sink.
    final class Lines: Sendable {
        private let storage = Locked<[String]>([])
        var sink: @Sendable (String) -> Void {
            { [storage] line in storage.withLock { $0.append(line) } }
        }
        var all: [String] { storage.withLock { $0 } }
    }

    /// `<ISO 8601 UTC timestamp> <level> <message>` and one newline.
    static let linePattern = #"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?Z) (debug|info|warning|error) (.*)\n$"#

    /// The timestamp, level and message of `line`, or an issue.
    static func parse(_ line: String, sourceLocation: SourceLocation = #_sourceLocation) throws -> (
        Date, String, String
    ) {
        let regex = try Regex(linePattern).dotMatchesNewlines(false)
        guard let match = try regex.wholeMatch(in: line) else {
            Issue.record("not a log line: \(line.debugDescription)", sourceLocation: sourceLocation)
            throw Unexpected(description: "not a log line")
        }
        let stamp = String(try #require(match.output[1].substring, sourceLocation: sourceLocation))
        let level = String(try #require(match.output[2].substring, sourceLocation: sourceLocation))
        let message = String(try #require(match.output[3].substring, sourceLocation: sourceLocation))
        let date = try Date.ISO8601FormatStyle(includingFractionalSeconds: true).parse(stamp)
        return (date, level, message)
    }

    @Test("a line is timestamp, level, message and one newline")
    func lineFormat() throws {
        let lines = Lines()
        let log = ServerLog(minimumLevel: .debug, sink: lines.sink)
        let before = Date.now
        log.log(.info, "listening on http://127.0.0.1:8080")
        log.log(.warning, "w")
        log.log(.error, "e")
        log.log(.debug, "d")
        let after = Date.now

        let written = lines.all
        #expect(written.count == 4)
        let parsed = try written.map { try Self.parse($0) }
        #expect(parsed.map(\.1) == ["info", "warning", "error", "debug"])
        #expect(parsed.map(\.2) == ["listening on http://127.0.0.1:8080", "w", "e", "d"])
        for (date, _, _) in parsed {
            // Millisecond precision at most is written: allow for the rounding.
            #expect(
                date >= before.addingTimeInterval(-1) && date <= after.addingTimeInterval(1),
                "timestamp \(date) not between \(before) and \(after)")
        }
    }

    @Test(
        "line breaks inside a message are replaced: one message, one line",
        arguments: [
            "a\nb", "a\r\nb", "a\rb", "\nleading", "trailing\n", "many\n\n\r\n\rbreaks",
        ])
    func oneLinePerMessage(message: String) throws {
        let lines = Lines()
        let log = ServerLog(minimumLevel: .info, sink: lines.sink)
        log.log(.error, message)
        let line = try #require(lines.all.first)
        #expect(lines.all.count == 1)
        #expect(line.hasSuffix("\n"))
        #expect(!line.dropLast().contains("\n"), "line: \(line.debugDescription)")
        #expect(!line.unicodeScalars.contains("\r"), "line: \(line.debugDescription)")
        let (_, level, text) = try Self.parse(line)
        #expect(level == "error")
        let expected = String(message.map { $0 == "\n" || $0 == "\r" || $0 == "\r\n" ? " " : $0 })
        #expect(text == expected)
    }

    @Test("other control characters are escaped, so client text cannot drive a terminal")
    func controlCharactersAreEscaped() throws {
        let lines = Lines()
        let log = ServerLog(minimumLevel: .info, sink: lines.sink)
        log.log(.error, "registration failed: \u{1B}[31mred\u{1B}[0m\u{07}\tend\u{7F}\u{9B}ü")
        let (_, _, text) = try Self.parse(try #require(lines.all.first))
        #expect(text == "registration failed: \\u{1b}[31mred\\u{1b}[0m\\u{7}\\u{9}end\\u{7f}\\u{9b}ü")
        #expect(!text.unicodeScalars.contains { $0.value < 0x20 || (0x7F...0x9F).contains($0.value) })
    }

    @Test("line separators and bidirectional overrides are escaped, so client text cannot spoof a line")
    func invisibleFormattingIsEscaped() throws {
        let lines = Lines()
        let log = ServerLog(minimumLevel: .info, sink: lines.sink)
        log.log(.error, "failed: \u{202E}gnp.exe\u{2028}INFO forged\u{2029}\u{200F}\u{2066}x\u{2069} ok")
        let (_, _, text) = try Self.parse(try #require(lines.all.first))
        #expect(text == "failed: \\u{202e}gnp.exe\\u{2028}INFO forged\\u{2029}\\u{200f}\\u{2066}x\\u{2069} ok")
    }

    @Test(
        "the minimum level filters lower levels out",
        arguments: [
            (ServerLogLevel.debug, ["debug", "info", "warning", "error"]),
            (.info, ["info", "warning", "error"]),
            (.warning, ["warning", "error"]),
            (.error, ["error"]),
        ])
    func minimumLevel(minimum: ServerLogLevel, expected: [String]) throws {
        let lines = Lines()
        let log = ServerLog(minimumLevel: minimum, sink: lines.sink)
        for level in [ServerLogLevel.debug, .info, .warning, .error] {
            log.log(level, "message at \(level.rawValue)")
        }
        let parsed = try lines.all.map { try Self.parse($0) }
        #expect(parsed.map(\.1) == expected)
        #expect(parsed.map(\.2) == expected.map { "message at \($0)" })
    }

    @Test("a filtered message is not even built")
    func filteredMessageNotEvaluated() {
        let lines = Lines()
        let log = ServerLog(minimumLevel: .warning, sink: lines.sink)
        let evaluated = Counter()
        log.log(
            .debug,
            {
                evaluated.increment()
                return "expensive"
            }())
        #expect(evaluated.value == 0)
        #expect(lines.all.isEmpty)
    }

    @Test("the default minimum level is info")
    func defaultLevel() {
        let lines = Lines()
        let log = ServerLog(sink: lines.sink)
        #expect(log.minimumLevel == .info)
        log.log(.debug, "hidden")
        log.log(.info, "shown")
        #expect(lines.all.count == 1)
    }

    @Test("lines from many threads arrive whole")
    func concurrentLines() async throws {
        let lines = Lines()
        let log = ServerLog(minimumLevel: .info, sink: lines.sink)
        await runOnThreads(8) { thread in
            for i in 0..<100 { log.log(.info, "thread \(thread) line \(i)") }
        }
        let all = lines.all
        #expect(all.count == 800)
        for line in all { _ = try Self.parse(line) }
    }
}

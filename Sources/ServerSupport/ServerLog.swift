import ForgePushToken

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif
#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// The service's log: one line per message, at or above a minimum level, written to standard error
/// by default. In the `text` format a line is `<ISO 8601 UTC timestamp> <level> <message>`; in the
/// `json` format it is one JSON object with the field names of Go's `log/slog` JSON handler
/// (`time`, `level`, `msg`), which log pipelines already map (see `Format`).
///
/// Thread-safety: `Sendable`; lines from different threads never interleave (each is one
/// `write(2)` of the whole line by the default sink).
public struct ServerLog: Sendable {
    /// How each line is written (`--log-format`).
    public enum Format: String, Sendable, CaseIterable {
        /// `2026-11-29T23:04:05.678Z info message`: for people reading a terminal.
        case text
        /// `{"time":"2026-11-29T23:04:05.678Z","level":"INFO","msg":"message"}`: one JSON object
        /// per line (RFC 8259, encoded by Foundation's `JSONEncoder`), `time` in RFC 3339 UTC,
        /// `level` one of `DEBUG`, `INFO`, `WARN`, `ERROR`; access lines add `method`, `path`,
        /// `status`, `bytes`, `duration_us` and `remote`.
        case json
    }

    /// How lines are written.
    public var format: Format = .text
    /// Whether a text line shows `scalar` as a `\u{…}` escape: C0, DEL and C1 controls, and the
    /// characters that change what a terminal shows without being visible themselves: U+2028 and
    /// U+2029 (line and paragraph separators), and the bidirectional formatting characters U+200E,
    /// U+200F, U+202A–U+202E and U+2066–U+2069 (Unicode Standard Annex #9; U+202E, RIGHT-TO-LEFT
    /// OVERRIDE, makes the rest of a line read backwards).
    private static func isControl(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.value {
        case 0..<0x20, 0x7F...0x9F, 0x200E, 0x200F, 0x2028...0x202E, 0x2066...0x2069: true
        default: false
        }
    }

    /// The lowest level written.
    public var minimumLevel: ServerLogLevel
    private let sink: @Sendable (String) -> Void

    /// Creates a log writing lines at or above `minimumLevel`, in `format` (default text), to `sink`
    /// (default: standard error). Each line given to `sink` ends with a newline.
    public init(
        minimumLevel: ServerLogLevel = .info, format: Format = .text,
        sink: @escaping @Sendable (String) -> Void = ServerLog.standardError
    ) {
        self.minimumLevel = minimumLevel
        self.format = format
        self.sink = sink
    }

    /// Writes `message` at `level` when `level >= minimumLevel`. Line breaks inside `message`
    /// are replaced by spaces so that one message is one line, and every other control character
    /// (C0, DEL, C1, the Unicode line separators and bidirectional formatting characters: text a
    /// client sent, such as a `POST /fail` message, must not drive or spoof the operator's
    /// terminal) by `\u{…}` escapes.
    ///
    /// In the `json` format the message is the `msg` field instead: the JSON encoder escapes line
    /// breaks and C0 controls, and DEL and C1 controls become `\u{…}` text as above.
    public func log(_ level: ServerLogLevel, _ message: @autoclosure () -> String) {
        guard level >= minimumLevel else { return }
        if format == .json {
            sink(JSONLine.line(level: level, message: message()))
            return
        }
        var text = message()
        if text.unicodeScalars.contains(where: Self.isControl) {
            var cleaned = ""
            for character in text {
                if character == "\n" || character == "\r" || character == "\r\n" {
                    cleaned.append(" ")
                    continue
                }
                for scalar in character.unicodeScalars {
                    if Self.isControl(scalar) {
                        cleaned += "\\u{" + String(scalar.value, radix: 16) + "}"
                    } else {
                        cleaned.unicodeScalars.append(scalar)
                    }
                }
            }
            text = cleaned
        }
        sink("\(Self.timestamp()) \(level.rawValue) \(text)\n")
    }

    /// Writes the access-log line of one completed request, at level info.
    /// - Parameters:
    ///   - method, path: the request's method and path (never its query, which may carry
    ///     `access_token`).
    ///   - status: the status sent, or `nil` when none was (the connection ended first).
    ///   - bytes: body bytes sent (for an event stream, every byte written to it).
    ///   - durationMicros: from the request's arrival to its completion, in microseconds.
    ///   - remote: the peer's address and port (`127.0.0.1:5000`, `[::1]:5000`); behind a proxy,
    ///     the proxy's. `nil` when unknown.
    ///
    /// Text: `GET /token 200 57 bytes 41 us` (no peer, as before). JSON: `msg` is
    /// `"<method> <path>"`, and the other values are fields of their own.
    public func access(
        method: String, path: String, status: Int?, bytes: Int, durationMicros: Int64,
        remote: @autoclosure () -> String?
    ) {
        guard minimumLevel <= .info else { return }
        switch format {
        case .text:
            log(.info, "\(method) \(path) \(status.map(String.init) ?? "-") \(bytes) bytes \(durationMicros) us")
        case .json:
            sink(
                JSONLine.line(
                    level: .info, message: "\(method) \(path)",
                    access: .init(
                        method: method, path: path, status: status, bytes: bytes,
                        durationMicros: durationMicros, remote: remote())))
        }
    }

    /// The current UTC time as ISO 8601 with milliseconds, `2026-11-29T23:04:05.678Z`, formatted by
    /// hand: with the access log on this runs once per request, and Foundation's date formatting
    /// cost more than the rest of the request.
    static func timestamp() -> String {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        var seconds = now.tv_sec
        var parts = tm()
        gmtime_r(&seconds, &parts)
        var bytes = [UInt8](repeating: 0, count: 24)
        func put(_ value: Int, at offset: Int, digits: Int) {
            var rest = value
            for index in stride(from: offset + digits - 1, through: offset, by: -1) {
                bytes[index] = UInt8(ascii: "0") + UInt8(rest % 10)
                rest /= 10
            }
        }
        put(Int(parts.tm_year) + 1900, at: 0, digits: 4)
        bytes[4] = UInt8(ascii: "-")
        put(Int(parts.tm_mon) + 1, at: 5, digits: 2)
        bytes[7] = UInt8(ascii: "-")
        put(Int(parts.tm_mday), at: 8, digits: 2)
        bytes[10] = UInt8(ascii: "T")
        put(Int(parts.tm_hour), at: 11, digits: 2)
        bytes[13] = UInt8(ascii: ":")
        put(Int(parts.tm_min), at: 14, digits: 2)
        bytes[16] = UInt8(ascii: ":")
        put(Int(parts.tm_sec), at: 17, digits: 2)
        bytes[19] = UInt8(ascii: ".")
        put(Int(now.tv_nsec) / 1_000_000, at: 20, digits: 3)
        bytes[23] = UInt8(ascii: "Z")
        return String(decoding: bytes, as: UTF8.self)
    }

    /// Writes `line` to standard error in one `write(2)` call (retrying on a partial write).
    public static let standardError: @Sendable (String) -> Void = { line in
        _ = Array(line.utf8).withUnsafeBytes { writeAll($0, to: 2) }
    }
}

import ForgePushToken

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// The `json` format of `ServerLog`: one object per line, with the field names and level names of
/// Go's `log/slog` JSON handler (`time`, `level`, `msg`; `DEBUG`, `INFO`, `WARN`, `ERROR`).
///
/// Every string value that needs an escape is encoded by Foundation's `JSONEncoder` (quotes,
/// backslashes, line breaks and C0 controls escaped as RFC 8259 §7 requires; printable ASCII
/// without `"` and `\` needs none and is quoted as it is); the fields are then joined in a fixed order
/// (`time`, `level`, `msg` first), which a keyed container would not keep. DEL and C1 controls,
/// which JSON allows raw but a terminal may act on, are first written as `\u{…}` text.
///
/// Thread-safety: stateless; safe from any thread.
enum JSONLine {
    /// The fields of an access-log line.
    struct Access {
        var method: String
        var path: String
        var status: Int?
        var bytes: Int
        var durationMicros: Int64
        var remote: String?
    }

    /// slog's name of `level`.
    static func levelName(_ level: PushTokenManager.LogLevel) -> String {
        switch level {
        case .debug: "DEBUG"
        case .info: "INFO"
        case .warning: "WARN"
        case .error: "ERROR"
        }
    }

    /// One complete line, ending in a newline.
    static func line(
        level: PushTokenManager.LogLevel, message: String, access: Access? = nil,
        time: String = ServerLog.timestamp()
    ) -> String {
        var line = ""
        line.reserveCapacity(access == nil ? 96 + message.utf8.count : 224 + 2 * message.utf8.count)
        line += "{\"time\":"
        line += string(time)
        line += ",\"level\":\""
        line += levelName(level)
        line += "\",\"msg\":"
        line += string(message)
        if let access {
            // A field: `,"name":` and the value, a JSON string or a whole number.
            func field(_ name: String, _ text: String) { line += ",\"\(name)\":" + string(text) }
            func field(_ name: String, number: some BinaryInteger) { line += ",\"\(name)\":\(number)" }
            field("method", access.method)
            field("path", access.path)
            if let status = access.status { field("status", number: status) }
            field("bytes", number: access.bytes)
            field("duration_us", number: access.durationMicros)
            if let remote = access.remote { field("remote", remote) }
        }
        line += "}\n"
        return line
    }

    /// `text` as a JSON string literal, quotes included. Printable ASCII without `"` and `\` (a
    /// timestamp, a method, most paths and messages) needs no escape and is quoted as it is, which
    /// keeps an access line cheap; anything else goes through the encoder.
    static func string(_ text: String) -> String {
        if text.utf8.allSatisfy({ $0 >= 0x20 && $0 < 0x7F && $0 != UInt8(ascii: "\"") && $0 != UInt8(ascii: "\\") }) {
            return "\"" + text + "\""
        }
        var text = text
        if text.unicodeScalars.contains(where: { (0x7F...0x9F).contains($0.value) }) {
            var cleaned = String.UnicodeScalarView()
            for scalar in text.unicodeScalars {
                if (0x7F...0x9F).contains(scalar.value) {
                    cleaned.append(contentsOf: ("\\u{" + String(scalar.value, radix: 16) + "}").unicodeScalars)
                } else {
                    cleaned.append(scalar)
                }
            }
            text = String(cleaned)
        }
        // Encoding a String cannot fail (it is always representable); the fallback keeps the line
        // valid JSON all the same.
        guard let data = try? encoder.encode(text) else { return "\"\"" }
        let encoded = String(decoding: data, as: UTF8.self)
        // U+2028 and U+2029 are valid in a JSON string, but tools that split text on Unicode line
        // breaks (JavaScript before ES2019, Python's splitlines) would cut the line there.
        guard encoded.unicodeScalars.contains(where: { $0.value == 0x2028 || $0.value == 0x2029 }) else {
            return encoded
        }
        var escaped = String.UnicodeScalarView()
        for scalar in encoded.unicodeScalars {
            switch scalar.value {
            case 0x2028: escaped.append(contentsOf: #"\u2028"#.unicodeScalars)
            case 0x2029: escaped.append(contentsOf: #"\u2029"#.unicodeScalars)
            default: escaped.append(scalar)
            }
        }
        return String(escaped)
    }

    /// `/` is left as is: paths read better unescaped, and JSON does not require the escape.
    /// (`JSONEncoder` is `Sendable`; its options are only set here, before any use.)
    private static let encoder: JSONEncoder = {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.withoutEscapingSlashes]
        return encoder
    }()
}

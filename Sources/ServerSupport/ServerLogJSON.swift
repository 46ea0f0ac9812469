import ForgePushToken

/// The `json` format of `ServerLog`: one object per line, with the field names and level names of
/// Go's `log/slog` JSON handler (`time`, `level`, `msg`; `DEBUG`, `INFO`, `WARN`, `ERROR`).
///
/// Every string value that needs an escape is encoded by the service's one JSON string escaper,
/// `JSONText` (quotes, backslashes, line breaks and C0 controls escaped as RFC 8259 §7 requires,
/// and U+2028 and U+2029; printable ASCII without `"` and `\` needs none and is quoted as it is);
/// the fields are then joined in a fixed order
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
    static func levelName(_ level: ServerLogLevel) -> String {
        switch level {
        case .debug: "DEBUG"
        case .info: "INFO"
        case .warning: "WARN"
        case .error: "ERROR"
        }
    }

    /// One complete line, ending in a newline.
    static func line(
        level: ServerLogLevel, message: String, access: Access? = nil,
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
    /// keeps an access line cheap; anything else goes through `JSONText`.
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
        var encoded: [UInt8] = []
        encoded.reserveCapacity(text.utf8.count + 16)
        JSONText.append(text, to: &encoded)
        return String(decoding: encoded, as: UTF8.self)
    }
}

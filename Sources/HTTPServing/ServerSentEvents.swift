import ServerSupport

/// Server-Sent Events framing, as the WHATWG HTML standard's "Server-sent events" section
/// (§9.2) defines the `text/event-stream` format.
///
/// Lines end with LF alone and no byte-order mark is written. Field values must not contain
/// CR or LF; each helper checks this with a precondition, since every value this service
/// frames is JSON or digits that it produced itself.
public enum ServerSentEvents {
    /// The media type of an event stream.
    public static let contentType = "text/event-stream"

    /// Header fields of an event-stream response (http-api.md, `GET /token/stream`):
    /// `no-transform` keeps compressing proxies out, `X-Accel-Buffering: no` stops nginx
    /// from buffering the stream.
    public static let responseHeaders: HTTPHeaders = [
        "Content-Type": contentType,
        "Cache-Control": "no-cache, no-transform",
        "X-Accel-Buffering": "no",
    ]

    /// One event: `id: <id>`, `event: <name>`, `data: <data>`, then an empty line (a
    /// `TokenSnapshot` renders its event this way, once per version, on first read).
    ///
    /// - Parameters:
    ///   - id: the event id (a client sends the last one back as `Last-Event-ID`).
    ///   - name: the event type; browsers deliver a named event to `addEventListener(name, …)`.
    ///   - data: one line of data as UTF-8 bytes, without CR or LF.
    /// - Returns: the UTF-8 bytes of the event.
    public static func event(id: UInt64, name: String, data: [UInt8]) -> [UInt8] {
        precondition(
            !name.containsLineBreak && !data.contains { $0 == 0x0A || $0 == 0x0D },
            "SSE field values must not contain CR or LF")
        var bytes: [UInt8] = []
        bytes.reserveCapacity(40 + name.utf8.count + data.count)
        bytes.append(contentsOf: "id: ".utf8)
        bytes.append(contentsOf: String(id).utf8)
        bytes.append(contentsOf: "\nevent: ".utf8)
        bytes.append(contentsOf: name.utf8)
        bytes.append(contentsOf: "\ndata: ".utf8)
        bytes.append(contentsOf: data)
        bytes.append(contentsOf: "\n\n".utf8)
        return bytes
    }

    /// A comment line followed by an empty line (`: <text>` LF LF); clients ignore it. Used as a
    /// heartbeat so that proxies keep an idle connection open.
    public static func comment(_ text: String) -> [UInt8] {
        precondition(!text.containsLineBreak, "SSE comments must not contain CR or LF")
        return Array(": \(text)\n\n".utf8)
    }

    /// The `retry: <milliseconds>` line, telling a client how long to wait before reconnecting.
    public static func retry(milliseconds: Int) -> [UInt8] {
        precondition(milliseconds >= 0, "retry must not be negative")
        return Array("retry: \(milliseconds)\n\n".utf8)
    }

    /// The heartbeat this service sends while a stream is idle: `: keep-alive` LF LF.
    public static let heartbeat: [UInt8] = comment("keep-alive")
}

extension StringProtocol {
    var containsLineBreak: Bool { utf8.contains { $0 == 0x0A || $0 == 0x0D } }
}

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
import ForgePushToken

/// The service's log: one line per message, `<ISO 8601 UTC timestamp> <level> <message>`, at or
/// above a minimum level, written to standard error by default.
///
/// Thread-safety: `Sendable`; lines from different threads never interleave (each is one
/// `write(2)` of the whole line by the default sink).
public struct ServerLog: Sendable {
    /// The lowest level written.
    public var minimumLevel: PushTokenManager.LogLevel
    private let sink: @Sendable (String) -> Void

    /// Creates a log writing lines at or above `minimumLevel` to `sink` (default: standard
    /// error). Each line given to `sink` ends with a newline.
    public init(minimumLevel: PushTokenManager.LogLevel = .info,
                sink: @escaping @Sendable (String) -> Void = ServerLog.standardError) {
        self.minimumLevel = minimumLevel
        self.sink = sink
    }

    /// Writes `message` at `level` when `level >= minimumLevel`. Line breaks inside `message`
    /// are replaced by spaces so that one message is one line.
    public func log(_ level: PushTokenManager.LogLevel, _ message: @autoclosure () -> String) {
        guard level >= minimumLevel else { return }
        let text = String(message().map { $0 == "\n" || $0 == "\r" || $0 == "\r\n" ? " " : $0 })
        sink("\(Date.now.formatted(.iso8601.time(includingFractionalSeconds: true).dateSeparator(.dash).year().month().day().timeZone(separator: .omitted))) \(level.rawValue) \(text)\n")
    }

    /// The manager's log handler, forwarding to this log.
    public var managerHandler: PushTokenManager.LogHandler {
        let log = self
        return { level, message in log.log(level, message) }
    }

    /// Writes `line` to standard error in one `write(2)` call (retrying on a partial write).
    public static let standardError: @Sendable (String) -> Void = { line in
        var bytes = Array(line.utf8)
        bytes.withUnsafeMutableBytes { buffer in
            var offset = 0
            while offset < buffer.count {
                let written = write(2, buffer.baseAddress! + offset, buffer.count - offset)
                if written <= 0 {
                    if written < 0 && errno == EINTR { continue }
                    return
                }
                offset += written
            }
        }
    }
}

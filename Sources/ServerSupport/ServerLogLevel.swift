/// The level of a line the service logs (`ServerLog` writes it; `--log-level` sets the least one
/// written). The service's own type, apart from the app library's `PushTokenManager.LogLevel`:
/// the server's levels follow its operators (docs/operations.md), not an app's log handler.
///
/// It lives in ServerSupport, with `ServerLog`, because every module that logs for the service
/// imports that: the token service, the engine, which does not import the owner, and the Redis
/// store, which does not import the HTTP layer. Ordered from the least to the most serious. Thread-safety: a value type, `Sendable`.
public enum ServerLogLevel: String, Sendable, Comparable, CaseIterable {
    /// Diagnostic detail.
    case debug
    /// Normal events worth recording.
    case info
    /// Something an operator should look at; the service goes on.
    case warning
    /// An operation failed.
    case error

    private var severity: Int {
        switch self {
        case .debug: 0
        case .info: 1
        case .warning: 2
        case .error: 3
        }
    }

    /// Whether `lhs` is less serious than `rhs`.
    public static func < (lhs: ServerLogLevel, rhs: ServerLogLevel) -> Bool {
        lhs.severity < rhs.severity
    }
}

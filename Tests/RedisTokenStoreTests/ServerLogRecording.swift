import ForgePushToken
import ForgePushTokenTestSupport
import ServerSupport

extension LogRecorder {
    /// The handler to give a Redis store, which logs at the service's levels (`ServerLogLevel`):
    /// each line is recorded at the app library's level of the same name, as the recorder keeps it.
    var serverHandler: @Sendable (ServerLogLevel, String) -> Void {
        let handler = handler
        return { level, message in
            let recorded: PushTokenManager.LogLevel =
                switch level {
                case .debug: .debug
                case .info: .info
                case .warning: .warning
                case .error: .error
                }
            handler(recorded, message)
        }
    }
}

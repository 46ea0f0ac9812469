import ForgePushTokenTestSupport
import Foundation
import Testing

@testable import ForgePushToken

/// Rule 10: failures and rejected tokens go to the log handler, with levels.
@Suite("Rule 10: logging")
struct LoggingTests {
    @Test func failuresAreLoggedAsErrorsWithTheErrorsDescription() {
        let log = LogRecorder()
        let manager = PushTokenManager(logHandler: log.handler)
        manager.didFailToRegister(error: TestError(description: "no valid aps-environment"))
        manager.didRegister(deviceToken: token(1))
        manager.didFailToRegister(error: TestError(description: "offline"))
        #expect(
            log.recorded == [
                .init(level: .error, message: "registration failed: no valid aps-environment"),
                .init(level: .error, message: "registration failed: offline"),
            ])
    }

    @Test func rejectedEmptyTokensAreLoggedAsWarnings() {
        let log = LogRecorder()
        let manager = PushTokenManager(logHandler: log.handler)
        manager.didRegister(deviceToken: Data())
        #expect(log.recorded == [.init(level: .warning, message: "rejected an empty device token")])
    }

    @Test func acceptedTokensAreNotLoggedAndNoMessageContainsAToken() {
        let log = LogRecorder()
        let manager = PushTokenManager(logHandler: log.handler)
        manager.didRegister(deviceToken: token(0xabcdef))
        manager.didRegister(deviceToken: token(0xabcdef))
        #expect(log.recorded.isEmpty)
        manager.didFailToRegister(error: TestError(description: "x"))
        manager.didRegister(deviceToken: Data())
        #expect(log.recorded.allSatisfy { !$0.message.contains(hex(0xabcdef)) })
    }

    @Test func theHandlerMayCallBackIntoTheManager() {
        // The handler runs outside the manager's lock.
        let seen = Locked<[String?]>([])
        let box = Locked<PushTokenManager?>(nil)
        let manager = PushTokenManager { _, _ in
            let current = box.withLock { $0 }?.token
            seen.withLock { $0.append(current) }
        }
        box.withLock { $0 = manager }
        manager.didRegister(deviceToken: token(7))
        manager.didFailToRegister(error: TestError(description: "x"))
        #expect(seen.withLock { $0 } == [hex(7)])
        box.withLock { $0 = nil }
    }

    @Test func levelsAreOrderedBySeverity() {
        typealias Level = PushTokenManager.LogLevel
        #expect(Level.debug < .info)
        #expect(Level.info < .warning)
        #expect(Level.warning < .error)
        #expect(!(Level.error < .error))
        #expect([Level.error, .debug, .warning, .info].sorted() == [.debug, .info, .warning, .error])
        #expect(Level(rawValue: "warning") == .warning)
    }

    @Test func defaultInitializerStartsWithoutToken() {
        // Logs to standard error here; only checks that the default handler is usable.
        let manager = PushTokenManager()
        #expect(manager.token == nil)
        PushTokenManager.defaultLogHandler()(.debug, "default log handler test line")
    }
}

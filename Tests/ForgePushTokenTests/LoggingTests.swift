import ForgePushTokenTestSupport
import Foundation
import Testing

@testable import ForgePushToken

/// Rule 10: failures and rejected tokens go to the log handler, with levels.
@Suite("Rule 10: logging")
struct LoggingTests {
    @Test func failuresAreLoggedAsErrorsByDomainAndCodeOnly() {
        let log = LogRecorder()
        let manager = PushTokenManager(logHandler: log.handler)
        manager.didFailToRegister(error: CocoaLikeError(domain: "NSCocoaErrorDomain", code: 3010))
        manager.didRegister(deviceToken: token(1))
        // A description carrying a URL and a token never reaches a message.
        let leaky = CocoaLikeError(
            domain: "NSURLErrorDomain", code: -1009,
            description: "offline: https://api.example.com/devices/\(hex(1))?user=42")
        manager.didFailToRegister(error: leaky)
        #expect(
            log.recorded == [
                .init(level: .error, message: "registration failed: NSCocoaErrorDomain error 3010"),
                .init(level: .error, message: "registration failed: NSURLErrorDomain error -1009"),
            ])
        #expect(log.recorded.allSatisfy { !$0.message.contains("https") && !$0.message.contains(hex(1)) })
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

    @Test func theDefaultHandlerWritesOneLinePerMessageWithoutTheError() {
        #expect(
            PushTokenManager.standardErrorLine(.warning, "rejected an empty device token")
                == "ForgePushToken warning: rejected an empty device token\n")
        #expect(
            PushTokenManager.standardErrorLine(.error, "registration failed: NSURLErrorDomain error -1009")
                == "ForgePushToken error: registration failed: NSURLErrorDomain error -1009\n")
        // The default manager starts without a token, like any other.
        #expect(PushTokenManager().token == nil)
    }

    @Test func theSummaryOfAnErrorIsItsDomainAndCode() {
        #expect(
            LoggedError.summary(CocoaLikeError(domain: "NSURLErrorDomain", code: -1001))
                == "NSURLErrorDomain error -1001")
        // A Swift error: its qualified type name and its code, not its description.
        let summary = LoggedError.summary(TestError(description: "secret https://example.com"))
        #expect(summary.hasSuffix("TestError error 1"))
        #expect(!summary.contains("secret"))
    }
}

/// An error with a chosen domain and code, as a bridged `NSError` (such as `URLError`) reports
/// them, and a description that must never be logged.
struct CocoaLikeError: Error, CustomStringConvertible {
    let domain: String
    let code: Int
    var description = "the description, which may carry a URL"
    var _domain: String { domain }
    var _code: Int { code }
}

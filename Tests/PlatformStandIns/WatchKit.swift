// A stand-in for Apple's WatchKit, used only by scripts/check-platform-branches.sh to type-check the
// `#elseif canImport(WatchKit)` branch of
// Sources/ForgePushToken/RemoteNotificationRegistration.swift on Linux. It declares only the
// members that branch calls, with the signatures, isolation and availability of Apple's SDK (as
// shown on each page cited). The bodies are never run.

/// Apple: `@MainActor class WKApplication : NSObject`, watchOS 7.0+: the app object of a
/// single-target watchOS app (Xcode 14 and later; such apps run on watchOS 7 and later).
/// https://developer.apple.com/documentation/watchkit/wkapplication
@available(watchOS 7.0, *)
@MainActor
open class WKApplication {
    /// Apple: `class func shared() -> WKApplication`, watchOS 7.0+.
    /// https://developer.apple.com/documentation/watchkit/wkapplication/shared()
    open class func shared() -> WKApplication { fatalError("stand-in: never run") }

    /// Apple: `func registerForRemoteNotifications()`, watchOS 7.0+.
    /// https://developer.apple.com/documentation/watchkit/wkapplication/registerforremotenotifications()
    open func registerForRemoteNotifications() {}
}

// `WKExtension` (watchOS 2.0–9.2, deprecated in 9.2) is deliberately not declared: the library
// does not call it, and with this stand-in any use of it fails the check.

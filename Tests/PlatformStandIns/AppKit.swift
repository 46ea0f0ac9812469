// A stand-in for Apple's AppKit, used only by scripts/check-platform-branches.sh to type-check the
// `#elseif canImport(AppKit)` branch of Sources/ForgePushToken/RemoteNotificationRegistration.swift
// on Linux. It declares only the members that branch calls, with the signatures, isolation and
// availability of Apple's SDK (as shown on each page cited). The bodies are never run.

/// Apple: `@MainActor class NSApplication : NSResponder`, macOS 10.0+.
/// https://developer.apple.com/documentation/appkit/nsapplication
@MainActor
open class NSApplication {
    /// Apple: `class var shared: NSApplication { get }`, macOS 10.0+ (not marked unavailable in
    /// app extensions).
    /// https://developer.apple.com/documentation/appkit/nsapplication/shared
    open class var shared: NSApplication { fatalError("stand-in: never run") }

    /// Apple: `func registerForRemoteNotifications()`, macOS 10.14+.
    /// https://developer.apple.com/documentation/appkit/nsapplication/registerforremotenotifications()
    @available(macOS 10.14, *)
    open func registerForRemoteNotifications() {}
}

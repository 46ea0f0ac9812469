// A stand-in for Apple's WatchKit, used only by scripts/check-platform-branches.sh to type-check the
// `canImport(WatchKit)` branches of Sources/ForgePushToken/RemoteNotificationRegistration.swift and
// APNsEnvironment.swift on Linux. It declares only the members those branches call, with the
// signatures, isolation and availability of Apple's SDK (as shown on each page cited). The bodies
// are never run.

import FoundationEssentials  // URL, as Apple's Foundation declares it

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

// BEGIN Bundle
// Apple's `Bundle` belongs to Foundation, which WatchKit re-exports (`import WatchKit` makes it visible);
// the stand-in declares it here because FoundationEssentials, which the library imports on Linux,
// has none. Only what Sources/ForgePushToken/APNsEnvironment.swift calls.

/// Apple (Foundation): `class Bundle : NSObject, @unchecked Sendable`, iOS 2.0+, macOS 10.0+,
/// tvOS 9.0+, watchOS 2.0+, visionOS 1.0+.
/// https://developer.apple.com/documentation/foundation/bundle
// `@unchecked Sendable` as Apple declares it; sound here because the stand-in has no stored state
// (and is never instantiated: its members are only type-checked).
open class Bundle: @unchecked Sendable {
    /// Apple: `class var main: Bundle { get }`.
    /// https://developer.apple.com/documentation/foundation/bundle/main
    open class var main: Bundle { fatalError("stand-in: never run") }

    /// Apple: `var bundleURL: URL { get }`, iOS 4.0+, macOS 10.6+.
    /// https://developer.apple.com/documentation/foundation/bundle/bundleurl
    open var bundleURL: URL { fatalError("stand-in: never run") }
}
// END Bundle

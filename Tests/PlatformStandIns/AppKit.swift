// A stand-in for Apple's AppKit, used only by scripts/check-platform-branches.sh to type-check the
// `canImport(AppKit)` branches of Sources/ForgePushToken/RemoteNotificationRegistration.swift and
// APNsEnvironment.swift on Linux. It declares only the members those branches call, with the
// signatures, isolation and availability of Apple's SDK (as shown on each page cited). The bodies
// are never run.

import FoundationEssentials  // URL, as Apple's Foundation declares it

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

// BEGIN Bundle
// Apple's `Bundle` belongs to Foundation, which AppKit re-exports (`import AppKit` makes it visible);
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

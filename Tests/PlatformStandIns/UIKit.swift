// A stand-in for Apple's UIKit, used only by scripts/check-platform-branches.sh to type-check the
// `canImport(UIKit)` branches of Sources/ForgePushToken/RemoteNotificationRegistration.swift and
// APNsEnvironment.swift on Linux. It declares only the members those branches call, with the
// signatures, isolation and availability of Apple's SDK (Swift interface of UIKit.framework, as
// shown on each page cited). The bodies are never run.

import FoundationEssentials  // URL, as Apple's Foundation declares it

/// Apple: `@MainActor class UIApplication : UIResponder`, iOS 2.0+, iPadOS 2.0+, Mac Catalyst
/// 13.1+, tvOS, visionOS 1.0+.
/// https://developer.apple.com/documentation/uikit/uiapplication
@MainActor
open class UIApplication {
    /// Apple: `class var shared: UIApplication { get }`, iOS 2.0+, Mac Catalyst 13.1+, tvOS,
    /// visionOS 1.0+; unavailable in iOS app extensions
    /// (`NS_EXTENSION_UNAVAILABLE_IOS("Use view controller based solutions where appropriate
    /// instead.")` in UIApplication.h, imported as `@available(iOSApplicationExtension,
    /// unavailable)`; Mac Catalyst, tvOS and visionOS extensions inherit the iOS rule).
    /// https://developer.apple.com/documentation/uikit/uiapplication/shared
    @available(iOSApplicationExtension, unavailable)
    open class var shared: UIApplication { fatalError("stand-in: never run") }

    /// Apple: `func registerForRemoteNotifications()`, iOS 8.0+, iPadOS 8.0+, Mac Catalyst
    /// 13.1+, tvOS, visionOS 1.0+.
    /// https://developer.apple.com/documentation/uikit/uiapplication/registerforremotenotifications()
    @available(iOS 8.0, macCatalyst 13.1, visionOS 1.0, *)
    open func registerForRemoteNotifications() {}

    // BEGIN Background
    /// Apple: `func beginBackgroundTask(withName taskName: String?, expirationHandler handler:
    /// (@MainActor @Sendable () -> Void)? = nil) -> UIBackgroundTaskIdentifier`, iOS 7.0+, iPadOS
    /// 7.0+, Mac Catalyst 13.1+, tvOS 9.0+, visionOS 1.0+.
    /// https://developer.apple.com/documentation/uikit/uiapplication/beginbackgroundtask(withname:expirationhandler:)
    open func beginBackgroundTask(
        withName taskName: String?, expirationHandler handler: (@MainActor @Sendable () -> Void)? = nil
    ) -> UIBackgroundTaskIdentifier { .invalid }

    /// Apple: `func endBackgroundTask(_ identifier: UIBackgroundTaskIdentifier)`, iOS 4.0+, iPadOS
    /// 4.0+, Mac Catalyst 13.1+, tvOS 9.0+, visionOS 1.0+.
    /// https://developer.apple.com/documentation/uikit/uiapplication/endbackgroundtask(_:)
    open func endBackgroundTask(_ identifier: UIBackgroundTaskIdentifier) {}
    // END Background
}

/// Apple: `struct UIBackgroundTaskIdentifier : Equatable, Hashable, RawRepresentable, Sendable`
/// with `static let invalid: UIBackgroundTaskIdentifier`, iOS 4.0+, tvOS 9.0+, visionOS 1.0+.
/// https://developer.apple.com/documentation/uikit/uibackgroundtaskidentifier
public struct UIBackgroundTaskIdentifier: Equatable, Hashable, RawRepresentable, Sendable {
    public let rawValue: Int
    public init(rawValue: Int) { self.rawValue = rawValue }
    /// Apple: `static let invalid: UIBackgroundTaskIdentifier`.
    public static let invalid = UIBackgroundTaskIdentifier(rawValue: 0)
}

// BEGIN Bundle
// Apple's `Bundle` belongs to Foundation, which UIKit re-exports (`import UIKit` makes it visible);
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

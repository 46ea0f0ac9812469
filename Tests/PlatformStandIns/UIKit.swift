// A stand-in for Apple's UIKit, used only by scripts/check-platform-branches.sh to type-check the
// `#if canImport(UIKit)` branch of Sources/ForgePushToken/RemoteNotificationRegistration.swift on
// Linux. It declares only the members that branch calls, with the signatures, isolation and
// availability of Apple's SDK (Swift interface of UIKit.framework, as shown on each page cited).
// The bodies are never run.

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
}

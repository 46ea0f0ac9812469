// A stand-in for Apple's UserNotifications, used only by scripts/check-platform-branches.sh to
// type-check the `canImport(UserNotifications)` branch of
// Sources/ForgePushToken/NotificationAuthorization.swift on Linux. It declares only the members
// that branch calls, with the signatures, isolation and availability of Apple's SDK (as shown on
// each page cited). The bodies are never run. Neither class is declared `Sendable` here, so the
// library is checked not to send one across isolation domains.

/// Apple: `class UNUserNotificationCenter : NSObject`, iOS 10.0+, iPadOS 10.0+, Mac Catalyst
/// 13.1+, macOS 10.14+, tvOS 10.0+, visionOS 1.0+, watchOS 3.0+.
/// https://developer.apple.com/documentation/usernotifications/unusernotificationcenter
open class UNUserNotificationCenter {
    /// Apple: `class func current() -> UNUserNotificationCenter`.
    /// https://developer.apple.com/documentation/usernotifications/unusernotificationcenter/current()
    open class func current() -> UNUserNotificationCenter { fatalError("stand-in: never run") }

    /// Apple: `func notificationSettings() async -> UNNotificationSettings` (the async form of
    /// `getNotificationSettings(completionHandler:)`).
    /// https://developer.apple.com/documentation/usernotifications/unusernotificationcenter/notificationsettings()
    open func notificationSettings() async -> UNNotificationSettings { fatalError("stand-in: never run") }
}

/// Apple: `class UNNotificationSettings : NSObject`, iOS 10.0+, macOS 10.14+, tvOS 10.0+,
/// watchOS 3.0+, visionOS 1.0+.
/// https://developer.apple.com/documentation/usernotifications/unnotificationsettings
open class UNNotificationSettings {
    /// Apple: `var authorizationStatus: UNAuthorizationStatus { get }`.
    /// https://developer.apple.com/documentation/usernotifications/unnotificationsettings/authorizationstatus
    open var authorizationStatus: UNAuthorizationStatus { fatalError("stand-in: never run") }
}

/// Apple: `enum UNAuthorizationStatus : Int, @unchecked Sendable` (`NS_ENUM(NSInteger)` in
/// UNUserNotificationCenter.h: `NotDetermined = 0, Denied, Authorized, Provisional, Ephemeral`).
/// https://developer.apple.com/documentation/usernotifications/unauthorizationstatus
public enum UNAuthorizationStatus: Int, Sendable {
    case notDetermined = 0
    case denied = 1
    case authorized = 2
    /// iOS 12.0+, macOS 10.14+, tvOS 12.0+, watchOS 5.0+.
    @available(iOS 12.0, macOS 10.14, tvOS 12.0, watchOS 5.0, *)
    case provisional = 3
    /// iOS 14.0+, Mac Catalyst 14.0+, visionOS 1.0+; unavailable on macOS, tvOS and watchOS.
    @available(iOS 14.0, *)
    @available(macOS, unavailable)
    @available(tvOS, unavailable)
    @available(watchOS, unavailable)
    case ephemeral = 4
}

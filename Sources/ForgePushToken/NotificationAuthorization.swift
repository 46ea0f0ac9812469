// The notification authorization status an upload carries (issue 46): the public value, and where
// it is read (UserNotifications' settings on Apple platforms, nothing elsewhere).

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

#if canImport(UserNotifications)
    import UserNotifications
#endif
#if canImport(UIKit) && !os(watchOS)
    import UIKit
#elseif canImport(AppKit)
    import AppKit
#elseif canImport(WatchKit)
    import WatchKit
#endif

/// Whether the user lets the app show notifications: the authorization status of Apple's
/// UserNotifications (`UNAuthorizationStatus`, read from `UNNotificationSettings`), as
/// ``PushTokenManager/TokenUpload/authorization`` carries it to the server.
///
/// A device token is valid whatever the status: APNs accepts notifications for a `denied` app and
/// the system does not show them. Send it with the token so that the server can tell, as OneSignal
/// and Airship do.
///
/// `Codable` as its raw value (`"authorized"`, …). A value type; `Sendable`.
public enum NotificationAuthorization: String, Sendable, Hashable, Codable, CaseIterable {
    /// The user allowed notifications (`UNAuthorizationStatus.authorized`).
    case authorized
    /// The user refused notifications, or turned them off in Settings (`.denied`).
    case denied
    /// Quiet notifications without asking, until the user decides (`.provisional`, iOS 12 and
    /// later).
    case provisional
    /// An App Clip's notifications for a limited time (`.ephemeral`, iOS 14 and later).
    case ephemeral
    /// The app has not asked yet (`.notDetermined`).
    case notDetermined

    /// The status of `UNAuthorizationStatus`'s raw value (UNUserNotificationCenter.h:
    /// `NotDetermined = 0, Denied, Authorized, Provisional, Ephemeral`), or `nil` for a value this
    /// library does not know. Read by raw value because `.ephemeral` is unavailable on macOS, tvOS
    /// and watchOS, where a `switch` could not name it.
    init?(authorizationStatusRawValue rawValue: Int) {
        switch rawValue {
        case 0: self = .notDetermined
        case 1: self = .denied
        case 2: self = .authorized
        case 3: self = .provisional
        case 4: self = .ephemeral
        default: return nil
        }
    }
}

/// Where an upload call reads the authorization status: the system's settings, or a fake in
/// tests. Must be thread-safe.
protocol NotificationAuthorizationReader: Sendable {
    /// The current status, or `nil` when it cannot be read.
    func read() async -> NotificationAuthorization?
}

/// The system's notification settings: `UNUserNotificationCenter.current().notificationSettings()`
/// where UserNotifications exists and the process is an app (a bundle whose name ends in `.app`;
/// `UNUserNotificationCenter.current()` raises an exception in a process without an app bundle, a
/// test runner or a command-line tool), else `nil`. Type-checked against the UserNotifications
/// stand-in by scripts/check-platform-branches.sh.
struct SystemNotificationAuthorization: NotificationAuthorizationReader {
    func read() async -> NotificationAuthorization? {
        #if canImport(UserNotifications) && (canImport(UIKit) || canImport(AppKit) || canImport(WatchKit))
            // `Bundle` comes from Foundation, which UIKit, AppKit and WatchKit re-export.
            guard Bundle.main.bundleURL.pathExtension == "app" else { return nil }
            let settings = await UNUserNotificationCenter.current().notificationSettings()
            return NotificationAuthorization(authorizationStatusRawValue: settings.authorizationStatus.rawValue)
        #else
            return nil
        #endif
    }
}

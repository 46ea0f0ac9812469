// What the server holds, kept across launches: the seam (ServerRecordStore), the record, and the
// stores (UserDefaults on Apple platforms, memory everywhere).

#if canImport(Darwin)
    import Foundation
#elseif canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// What ``PushTokenManager/uploadTokenChanges(retryPolicy:environment:serverRecord:clock:randomSource:isolation:upload:)``
/// knows about the server, kept across launches by a ``ServerRecordStore``.
///
/// Written when an upload answers ``PushTokenManager/UploadOutcome/done`` (the server
/// acknowledged it), and when the app calls ``PushTokenManager/signOut()->()`` or
/// ``PushTokenManager/resumeUploads()``. After a relaunch the record tells the next upload which
/// token the server holds (``PushTokenManager/TokenUpload/serverToken``), and keeps an unchanged
/// token from being uploaded again before the policy's
/// ``PushTokenManager/UploadRetryPolicy/resendInterval``, counted from ``acknowledged``.
///
/// `Codable` (keys `token`, `environment`, `acknowledged`, `uploadsPaused`, `authorization`); the
/// `UserDefaults` store keeps it as JSON, bound to the device that wrote it. A value type;
/// `Sendable`.
public struct ServerRecord: Sendable, Hashable, Codable {
    /// The device token the server acknowledged last, as lowercase hex, or `nil` when it holds
    /// none (nothing uploaded yet, or its last acknowledged upload was a clear or a sign-out).
    public var token: String?
    /// The APNs environment of ``token`` when it was acknowledged.
    public var environment: APNsEnvironment
    /// The wall-clock time of the acknowledgement (a `Date`: the injected clock of the upload does
    /// not survive a relaunch, the wall clock does), or `nil` when nothing was acknowledged.
    public var acknowledged: Date?
    /// Whether the app called ``PushTokenManager/signOut()->()`` and not yet
    /// ``PushTokenManager/resumeUploads()``: nothing is uploaded but the sign-out. A record with
    /// this set and a ``token`` means the sign-out is still owed to the server.
    public var uploadsPaused: Bool
    /// The notification authorization status the server acknowledged with ``token``
    /// (``PushTokenManager/TokenUpload/authorization``), or `nil` when none was known. A different
    /// status read later uploads the token again.
    public var authorization: NotificationAuthorization?

    /// A record.
    ///
    /// - Parameters:
    ///   - token: The token the server holds, or `nil`.
    ///   - environment: The token's APNs environment.
    ///   - acknowledged: When the server acknowledged it (wall clock), or `nil`.
    ///   - uploadsPaused: Whether uploads are paused by a sign-out.
    ///   - authorization: The authorization status acknowledged with `token`, or `nil` (the
    ///     default).
    public init(
        token: String?, environment: APNsEnvironment, acknowledged: Date?, uploadsPaused: Bool,
        authorization: NotificationAuthorization? = nil
    ) {
        self.token = token
        self.environment = environment
        self.acknowledged = acknowledged
        self.uploadsPaused = uploadsPaused
        self.authorization = authorization
    }

    private enum CodingKeys: String, CodingKey {
        case token, environment, acknowledged, uploadsPaused, authorization
    }

    /// Decodes a record from the JSON that ``encode(to:)`` writes.
    ///
    /// - Throws: `DecodingError` when a key is missing (`token`, `acknowledged` and
    ///   `authorization` may be absent or null) or a value has the wrong type; the stores then
    ///   read no record.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        token = try container.decodeIfPresent(String.self, forKey: .token)
        environment = try container.decode(APNsEnvironment.self, forKey: .environment)
        acknowledged = try container.decodeIfPresent(Date.self, forKey: .acknowledged)
        uploadsPaused = try container.decode(Bool.self, forKey: .uploadsPaused)
        authorization = try container.decodeIfPresent(NotificationAuthorization.self, forKey: .authorization)
    }

    /// Encodes the record: `token` (omitted when `nil`), `environment` (its raw value),
    /// `acknowledged` (the encoder's `Date` strategy; omitted when `nil`), `uploadsPaused` and
    /// `authorization` (its raw value; omitted when `nil`).
    ///
    /// - Throws: What the encoder throws.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encodeIfPresent(token, forKey: .token)
        try container.encode(environment, forKey: .environment)
        try container.encodeIfPresent(acknowledged, forKey: .acknowledged)
        try container.encode(uploadsPaused, forKey: .uploadsPaused)
        try container.encodeIfPresent(authorization, forKey: .authorization)
    }
}

/// Where ``ServerRecord`` is kept between launches: the seam tests replace.
///
/// ``PushTokenManager/uploadTokenChanges(retryPolicy:environment:serverRecord:clock:randomSource:isolation:upload:)``
/// loads the record once when it starts and saves it after each change, from the task that runs
/// it (never concurrently for one call). The default is `UserDefaultsServerRecordStore` on Apple
/// platforms and ``MemoryServerRecordStore`` elsewhere.
///
/// Implementations must be thread-safe (`Sendable`), should return quickly, and must not throw:
/// a record that cannot be read is `nil` (the upload then starts as on a first launch).
public protocol ServerRecordStore: Sendable {
    /// The record saved last, or `nil` when there is none or it cannot be read.
    func load() -> ServerRecord?
    /// Replaces the record.
    func save(_ record: ServerRecord)
}

/// A ``ServerRecordStore`` in memory: nothing survives the process. The default where there is
/// no `UserDefaults` (Linux), and the store tests use to stand for a relaunch (keep the store,
/// make a new manager).
///
/// Thread-safe: the record is behind a lock.
public final class MemoryServerRecordStore: ServerRecordStore {
    private let record: Locked<ServerRecord?>

    /// A store holding `record` (none by default).
    ///
    /// - Parameter record: The record ``load()`` returns until the first ``save(_:)``.
    public init(_ record: ServerRecord? = nil) {
        self.record = Locked(record)
    }

    /// The record saved last, or the one given to ``init(_:)``.
    public func load() -> ServerRecord? {
        record.withLock { $0 }
    }

    /// Replaces the record.
    public func save(_ record: ServerRecord) {
        self.record.withLock { $0 = record }
    }
}

/// A marker that stays on the device that wrote it: an identifier kept where a backup does not
/// carry it, so that a backup restored onto another device (an iCloud or Finder backup, a
/// migration) has none. Must be thread-safe.
protocol DeviceMarker: Sendable {
    /// The marker's identifier, or `nil` when this device has none (a new install, or a restore
    /// onto another device).
    func read() -> String?
    /// Makes a new marker and returns its identifier, or `nil` when it cannot be written.
    func create() -> String?
}

/// A ``DeviceMarker`` in a file holding a random UUID, excluded from backups on Apple platforms
/// (`URLResourceValues.isExcludedFromBackup`, so neither an iCloud nor a Finder backup carries
/// it). Reading and writing a file's contents is no required-reason API (the privacy manifest
/// declares none for it). Thread-safe: each call reads or replaces the whole file.
struct FileDeviceMarker: DeviceMarker {
    /// The file.
    let url: URL

    func read() -> String? {
        guard let data = try? Data(contentsOf: url), !data.isEmpty else { return nil }
        return String(decoding: data, as: UTF8.self)
    }

    func create() -> String? {
        let identifier = UUID().uuidString
        do {
            try FileManager.default.createDirectory(
                at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
            try Data(identifier.utf8).write(to: url, options: .atomic)
        } catch {
            return nil
        }
        #if canImport(Darwin)
            // A marker that a backup would carry binds nothing: without the exclusion, write none.
            guard excludeFromBackup(url) else {
                try? FileManager.default.removeItem(at: url)
                return nil
            }
        #endif
        return identifier
    }
}

/// Keeps a ``ServerRecord`` bound to the device that wrote it: the record is stored with the
/// identifier of the device's ``DeviceMarker`` (JSON `{"device": …, "record": …}`), and a record
/// whose identifier is not this device's marker (restored from another device's backup, or
/// written before the binding existed) is read as none, so that its ``ServerRecord/token`` (the
/// other device's token) is never named as replaced.
///
/// Thread-safe when its `read` and `write` are.
struct DeviceBoundRecords: Sendable {
    /// The device's marker.
    let marker: any DeviceMarker
    /// Reads the stored bytes, or `nil`.
    let read: @Sendable () -> Data?
    /// Replaces the stored bytes.
    let write: @Sendable (Data) -> Void

    private struct Envelope: Codable {
        var device: String
        var record: ServerRecord
    }

    /// The stored record when it was written on this device, else `nil`.
    func load() -> ServerRecord? {
        guard let data = read(), let envelope = try? JSONDecoder().decode(Envelope.self, from: data),
            let device = marker.read(), device == envelope.device
        else { return nil }
        return envelope.record
    }

    /// Stores `record` with this device's marker, making the marker first if there is none; stores
    /// nothing when no marker can be made (the next launch then starts as a first one).
    func save(_ record: ServerRecord) {
        guard let device = marker.read() ?? marker.create(),
            let data = try? JSONEncoder().encode(Envelope(device: device, record: record))
        else { return }
        write(data)
    }
}

// scripts/check-platform-branches.sh type-checks the lines between BEGIN and END with the library
// against swift-corelibs-foundation's `UserDefaults` on Linux, where this branch is not compiled.
#if canImport(Darwin)
    // BEGIN UserDefaults store
    /// A ``ServerRecordStore`` in `UserDefaults`, bound to the device that wrote it: the default on
    /// Apple platforms.
    ///
    /// The record is one JSON-encoded `Data` value under ``defaultKey``
    /// (`"ForgePushToken.serverRecord"`) of `UserDefaults.standard`, unless another suite or key
    /// is given, together with the identifier of a marker file that only this device has:
    /// `Application Support/ForgePushToken/<key>.device-marker`, excluded from backups
    /// (`URLResourceValues.isExcludedFromBackup`). `UserDefaults` goes into iCloud and Finder
    /// backups, and a backup restored onto another device brings the record along but not the
    /// marker: there the record is read as none, so the new device's first upload names no
    /// ``PushTokenManager/TokenUpload/serverToken`` (the old device's token, which a server would
    /// otherwise replace, cutting off a phone still in use). A value that does not decode is read
    /// as no record too.
    ///
    /// `UserDefaults` is a required-reason API; the library's privacy manifest
    /// (PrivacyInfo.xcprivacy) declares it with reason `CA92.1` (information only the app itself
    /// reads). An app-group suite (`suiteName`) is shared with the app's other targets: Apple asks
    /// for reason `1C8F.1` for that, which the app declares in its own privacy manifest.
    ///
    /// Thread-safe: `UserDefaults` is (Apple's documentation), and the marker file is read and
    /// replaced whole.
    public struct UserDefaultsServerRecordStore: ServerRecordStore {
        /// The key the record is kept under by default: `"ForgePushToken.serverRecord"`.
        public static let defaultKey = "ForgePushToken.serverRecord"

        /// The suite's name, or `nil` for `UserDefaults.standard`.
        public let suiteName: String?
        /// The key the record is kept under.
        public let key: String

        /// A store in `UserDefaults`.
        ///
        /// - Parameters:
        ///   - suiteName: An app-group suite (`UserDefaults(suiteName:)`; declare reason `1C8F.1` in
        ///     the app's privacy manifest), or `nil` (the default) for `UserDefaults.standard`.
        ///   - key: The key; ``defaultKey`` by default.
        public init(suiteName: String? = nil, key: String = UserDefaultsServerRecordStore.defaultKey) {
            self.suiteName = suiteName
            self.key = key
        }

        private var records: DeviceBoundRecords {
            let suiteName = suiteName
            let key = key
            let defaults: @Sendable () -> UserDefaults = {
                suiteName.flatMap { UserDefaults(suiteName: $0) } ?? .standard
            }
            let folder =
                FileManager.default.urls(for: .applicationSupportDirectory, in: .userDomainMask).first
                ?? FileManager.default.temporaryDirectory
            return DeviceBoundRecords(
                marker: FileDeviceMarker(
                    url: folder.appendingPathComponent("ForgePushToken").appendingPathComponent("\(key).device-marker")),
                read: { defaults().data(forKey: key) },
                write: { defaults().set($0, forKey: key) })
        }

        /// The record under ``key`` when this device wrote it, or `nil` when there is none, it does
        /// not decode, or it was restored from another device.
        public func load() -> ServerRecord? {
            records.load()
        }

        /// Writes `record` under ``key``, bound to this device.
        public func save(_ record: ServerRecord) {
            records.save(record)
        }
    }

    /// Excludes the file at `url` from iCloud and Finder backups; `false` when that fails.
    func excludeFromBackup(_ url: URL) -> Bool {
        var values = URLResourceValues()
        values.isExcludedFromBackup = true
        var url = url
        return (try? url.setResourceValues(values)) != nil
    }
// END UserDefaults store
#endif

extension PushTokenManager {
    /// The store ``uploadTokenChanges(retryPolicy:environment:serverRecord:clock:randomSource:isolation:upload:)``
    /// uses by default: `UserDefaultsServerRecordStore` (key
    /// `UserDefaultsServerRecordStore.defaultKey`) on Apple platforms, a new
    /// ``MemoryServerRecordStore`` elsewhere.
    public static func defaultServerRecordStore() -> any ServerRecordStore {
        #if canImport(Darwin)
            UserDefaultsServerRecordStore()
        #else
            MemoryServerRecordStore()
        #endif
    }
}

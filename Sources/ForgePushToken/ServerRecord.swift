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
/// acknowledged it), and when the app calls ``PushTokenManager/signOut()`` or
/// ``PushTokenManager/resumeUploads()``. After a relaunch the record tells the next upload which
/// token the server holds (``PushTokenManager/TokenUpload/serverToken``), and keeps an unchanged
/// token from being uploaded again before the policy's
/// ``PushTokenManager/UploadRetryPolicy/resendInterval``, counted from ``acknowledged``.
///
/// `Codable` (keys `token`, `environment`, `acknowledged`, `uploadsPaused`); the
/// `UserDefaults` store keeps it as JSON. A value type; `Sendable`.
public struct ServerRecord: Sendable, Hashable, Codable {
    /// The device token the server acknowledged last, as lowercase hex, or `nil` when it holds
    /// none (nothing uploaded yet, or its last acknowledged upload was a clear or a sign-out).
    public var token: String?
    /// The APNs environment of ``token`` when it was acknowledged.
    public var environment: APNsEnvironment
    /// The wall-clock time of the acknowledgement (a `Date`: the injected clock of the upload does
    /// not survive a relaunch, the wall clock does), or `nil` when nothing was acknowledged.
    public var acknowledged: Date?
    /// Whether the app called ``PushTokenManager/signOut()`` and not yet
    /// ``PushTokenManager/resumeUploads()``: nothing is uploaded but the sign-out. A record with
    /// this set and a ``token`` means the sign-out is still owed to the server.
    public var uploadsPaused: Bool

    /// A record.
    ///
    /// - Parameters:
    ///   - token: The token the server holds, or `nil`.
    ///   - environment: The token's APNs environment.
    ///   - acknowledged: When the server acknowledged it (wall clock), or `nil`.
    ///   - uploadsPaused: Whether uploads are paused by a sign-out.
    public init(token: String?, environment: APNsEnvironment, acknowledged: Date?, uploadsPaused: Bool) {
        self.token = token
        self.environment = environment
        self.acknowledged = acknowledged
        self.uploadsPaused = uploadsPaused
    }

    private enum CodingKeys: String, CodingKey {
        case token, environment, acknowledged, uploadsPaused
    }

    /// Decodes a record from the JSON that ``encode(to:)`` writes.
    ///
    /// - Throws: `DecodingError` when a key is missing (`token` and `acknowledged` may be absent
    ///   or null) or a value has the wrong type; the stores then read no record.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        token = try container.decodeIfPresent(String.self, forKey: .token)
        environment = try container.decode(APNsEnvironment.self, forKey: .environment)
        acknowledged = try container.decodeIfPresent(Date.self, forKey: .acknowledged)
        uploadsPaused = try container.decode(Bool.self, forKey: .uploadsPaused)
    }

    /// Encodes the record: `token` (omitted when `nil`), `environment` (its raw value),
    /// `acknowledged` (the encoder's `Date` strategy; omitted when `nil`) and `uploadsPaused`.
    ///
    /// - Throws: What the encoder throws.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encodeIfPresent(token, forKey: .token)
        try container.encode(environment, forKey: .environment)
        try container.encodeIfPresent(acknowledged, forKey: .acknowledged)
        try container.encode(uploadsPaused, forKey: .uploadsPaused)
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

// scripts/check-platform-branches.sh type-checks the lines between BEGIN and END with the library
// against swift-corelibs-foundation's `UserDefaults` on Linux, where this branch is not compiled.
#if canImport(Darwin)
    // BEGIN UserDefaults store
    /// A ``ServerRecordStore`` in `UserDefaults`: the default on Apple platforms.
    ///
    /// The record is one JSON-encoded `Data` value under ``defaultKey``
    /// (`"ForgePushToken.serverRecord"`) of `UserDefaults.standard`, unless another suite or key
    /// is given. `UserDefaults` is a required-reason API; the library's privacy manifest
    /// (PrivacyInfo.xcprivacy) declares it with reason `CA92.1` (information only the app itself
    /// reads). A value that does not decode is read as no record.
    ///
    /// Thread-safe: `UserDefaults` is (Apple's documentation).
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
        ///   - suiteName: An app-group suite (`UserDefaults(suiteName:)`), or `nil` (the default)
        ///     for `UserDefaults.standard`.
        ///   - key: The key; ``defaultKey`` by default.
        public init(suiteName: String? = nil, key: String = UserDefaultsServerRecordStore.defaultKey) {
            self.suiteName = suiteName
            self.key = key
        }

        private var defaults: UserDefaults {
            suiteName.flatMap { UserDefaults(suiteName: $0) } ?? .standard
        }

        /// The record under ``key``, or `nil` when there is none or it does not decode.
        public func load() -> ServerRecord? {
            guard let data = defaults.data(forKey: key) else { return nil }
            return try? JSONDecoder().decode(ServerRecord.self, from: data)
        }

        /// Writes `record` under ``key``.
        public func save(_ record: ServerRecord) {
            guard let data = try? JSONEncoder().encode(record) else { return }
            defaults.set(data, forKey: key)
        }
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

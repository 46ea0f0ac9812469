/// Where the versioned token is kept, and the one place that decides whether a write changes it.
///
/// The owner (`TokenOwner`) never compares tokens itself: it proposes the token a write asks for
/// and applies the `CommitOutcome` the store returns. Implementations: `MemoryTokenStore` (the
/// process's memory alone), `StateFileStore` (memory plus the durable `--state-file`); a store
/// shared by several replicas decides in its own atomic step (docs/architecture.md, "Adding a
/// store").
///
/// There is one way to commit, `commit(_:base:completion:)`, for every store: it returns the
/// outcome when it decided before returning (a local store always does), else `nil`, and the
/// outcome arrives through its completion; `ordering` says whether the owner runs commits one at a
/// time. What the layers above show of a store (its name when shared, its durable writes, its own
/// series) is one value, `status()`, with no protocol's words in it.
///
/// Thread-safety: implementations are `Sendable`; the owner may call every member from any thread
/// (`commit` one at a time with `.ownerSerialized` ordering).
public protocol TokenStore: AnyObject, Sendable {
    /// How commits are ordered: whether the owner must run them one at a time, each on the
    /// outcome of the one before, or the store orders them itself.
    var ordering: CommitOrdering { get }

    /// Proposes `token` (lowercase hex, or `nil` to clear it) as the new token.
    ///
    /// The store decides: the same token as the current one is `.unchanged` (no version bump,
    /// nothing published); another one is stored at the next version. A store that decides before
    /// it returns returns the outcome, and never calls `completion`; otherwise it returns `nil` and
    /// calls `completion` exactly once, on any thread, after the outcome is known. With
    /// `.ownerSerialized` ordering it must decide before it returns (the owner answers a store that
    /// returns `nil` there `.unknown`, and ignores its completion).
    /// - Parameters:
    ///   - token: the proposed token.
    ///   - base: the owner's current state. A store with `.ownerSerialized` ordering decides against
    ///     it (the owner guarantees it is the outcome of the previous commit); a store that orders
    ///     commits itself may ignore it.
    ///   - completion: receives the outcome when it is not returned.
    /// - Returns: the outcome when decided before returning, else `nil`.
    func commit(_ token: String?, base: TokenState, completion: @escaping @Sendable (CommitOutcome) -> Void)
        -> CommitOutcome?

    /// Starts reporting what the owner cannot learn from its own commits: changes that arrive from
    /// elsewhere (another replica) and the store's health. Called once by the owner
    /// (`TokenOwner.start()`), before any commit.
    ///
    /// `report` may be called on any thread, and never while the store holds a lock of its own:
    /// the owner delivers a change to its subscribers inside `report`, and a delivery wakes the
    /// engine's connections (docs/architecture.md, "Locks"). A store delivers its reports in the
    /// order it decided them. `current` reads the owner's state at any time (it never waits for a
    /// commit): a shared store decides with it whether a state it read is news to the owner, and
    /// writes it back when the shared copy was lost, instead of keeping a copy of its own.
    func start(
        reporting report: @escaping @Sendable (TokenStoreEvent) -> Void,
        current: @escaping @Sendable () -> TokenState)

    /// Stops background work (threads, connections). Called once, by `TokenOwner.close()` after
    /// the HTTP server has stopped, so that writes still in flight during graceful shutdown kept
    /// their store until then; the state the store keeps is left as it is. A store may give up on
    /// a commit whose I/O has not returned by then (a disk that hangs: `StateFileStore`): its
    /// completion is then never called, since nobody is left to answer.
    func stop()

    /// Asks the store to read the shared state again soon, without waiting for it: a subscriber
    /// knows a version above the owner's, so this replica may be behind. What it reads arrives as
    /// `TokenStoreEvent.changed`. A store may coalesce requests. Nothing by default.
    func refresh()

    /// What the store is and has done, now (`StoreStatus`): a small value the layers above read
    /// to show the store, at any time, from any thread. `StoreStatus()` (a local store with
    /// nothing to show) by default.
    func status() -> StoreStatus
}

extension TokenStore {
    /// Nothing: a store the process has alone holds no state but the owner's.
    public func refresh() {}

    /// `StoreStatus()`: not shared, no durable copy, no series of its own.
    public func status() -> StoreStatus { StoreStatus() }
}

/// What a store is and has done, as `TokenStore.status()` returns it: plain values, so that the
/// owner's module knows nothing of how the HTTP layer shows them (docs/architecture.md, "Adding a
/// store": the token service's replica mode and its metrics read this).
///
/// A value type; `Sendable`.
public struct StoreStatus: Sendable, Equatable {
    /// The name of the shared store when the service is one replica of several sharing the token
    /// through it (`redis`, docs/replicas.md), else `nil`.
    public var sharedName: String?
    /// How many times the store has written its durable copy (each write holding every change
    /// decided since the one before), when it keeps one that can fail to be saved (the state
    /// file); `nil` when it keeps none.
    public var durableWrites: UInt64?
    /// The store's own metric families, as values (`StoreMetric`) the HTTP layer renders; empty
    /// for none.
    public var series: [StoreMetric]

    /// A status; by default that of a local store with nothing to show.
    public init(sharedName: String? = nil, durableWrites: UInt64? = nil, series: [StoreMetric] = []) {
        self.sharedName = sharedName
        self.durableWrites = durableWrites
        self.series = series
    }
}

/// How a store's commits are ordered.
public enum CommitOrdering: Sendable, Equatable {
    /// One commit at a time, each given the outcome of the one before as its base (a local store:
    /// its decision is a comparison with the owner's state). Readers never wait for it.
    case ownerSerialized
    /// The store decides atomically on its own, against the state it keeps, and commits may
    /// overlap (a shared store).
    case storeSerialized
}

/// The outcome of one commit, as the store decided it.
public enum CommitOutcome: Sendable, Equatable {
    /// The token changed; the store holds `state` (its new version) durably.
    case applied(TokenState)
    /// The proposed token was already current: nothing changed; `state` is the store's current one.
    case unchanged(TokenState)
    /// The change could not be made durable: `reason` says why, in one line for the log. It does
    /// not stand: the store's state is still the one before it, so it is neither served nor
    /// streamed. Like `.unknown`, it may or may not be in the durable copy (a state file's rename
    /// can land before its folder's `fsync` fails), so the store never gives the version it tried
    /// to another token, across a restart too, and it writes its state again on the next commit.
    /// Nothing retries the write: the client does.
    case notSaved(reason: String)
    /// The store did not answer in time: the change may or may not have been applied. Retrying
    /// the same write is safe (a write of the current token changes nothing).
    case unknown(reason: String)
    /// The store refused or could not be reached: nothing was applied. `reason` is one line for
    /// the log; retrying later may succeed.
    case unavailable(reason: String)
    /// The token would change, but no higher version is left for it (2^64 - 1 for the local
    /// stores, 2^53 - 1 for Redis, whose Lua numbers are exact only that far): nothing was
    /// applied, and retrying cannot succeed until the state starts afresh
    /// (`TokenState.versionExhausted` says how, for the log).
    case versionExhausted
    /// The owner is stopping (graceful shutdown): the write was not proposed to the store, so that
    /// no change is made after every subscriber has had its last event.
    case stopping

    /// The state the store reported, when it reported one.
    public var state: TokenState? {
        switch self {
        case .applied(let state), .unchanged(let state): state
        case .notSaved, .unknown, .unavailable, .versionExhausted, .stopping: nil
        }
    }

    /// Whether this commit changed the token.
    public var changed: Bool {
        switch self {
        case .applied: true
        case .unchanged, .notSaved, .unknown, .unavailable, .versionExhausted, .stopping: false
        }
    }
}

/// What a store reports on its own (`TokenStore.start(reporting:current:)`).
public enum TokenStoreEvent: Sendable, Equatable {
    /// The store holds `state`, changed elsewhere (or read again after a reconnect). The owner
    /// applies it only when its version is higher than the owner's: versions never go back.
    case changed(TokenState)
    /// The store's health changed.
    case health(StoreHealth)
}

/// How well the store keeps the state (the HTTP layer serves it as the service's health,
/// docs/http-api.md).
public enum StoreHealth: Sendable, Equatable {
    /// Reads are current and writes are durable.
    case ok
    /// Still serving, but the state may not be durable or current, or writes are refused.
    case degraded(reason: HealthReason)
    /// The state has not been read yet: reads and writes cannot be served.
    case starting(reason: HealthReason)
}

/// Why a store's health is not `ok`: a short snake_case code, served by the HTTP layer as it is
/// (docs/http-api.md) and compared as a value, never as free text. The owner's reasons are
/// declared here; a store adds its own in an extension (the Redis store's link reasons, such as
/// `unreachable` and `auth_failed`, in docs/replicas.md).
///
/// A value type; `Sendable`.
public struct HealthReason: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    /// The code as served (`state_not_saved`).
    public let rawValue: String

    /// The reason whose code is `rawValue` (snake_case ASCII).
    public init(rawValue: String) {
        self.rawValue = rawValue
    }

    /// The code.
    public var description: String { rawValue }

    /// The last write could not be made durable (a state file that could not be written): its
    /// change was refused, and the file may hold a state other than the one served until a write
    /// succeeds.
    public static let stateNotSaved = HealthReason(rawValue: "state_not_saved")
    /// The version is the last one the store can keep: every change is refused
    /// (`CommitOutcome.versionExhausted`).
    public static let versionExhausted = HealthReason(rawValue: "version_exhausted")
}

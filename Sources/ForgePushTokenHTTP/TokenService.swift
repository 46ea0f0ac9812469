#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif
import ForgePushToken

/// The service's state: one `PushTokenManager` plus the version counter that the manager's API
/// does not carry.
///
/// Writes are serialised under one lock that holds the current `TokenSnapshot`: each write calls
/// the manager, compares `token` before and after to learn whether it changed, and on a change
/// bumps the version and renders the new snapshot. Readers take the snapshot under the same
/// lock. The manager's own lock nests inside this one; the manager never calls back into the
/// service, so the order cannot invert.
///
/// Thread-safety: all members may be called from any thread.
public final class TokenService: Sendable {
    /// The manager the service drives; its `tokenStream` feeds the event stream.
    public let manager: PushTokenManager
    private let state: Locked<TokenSnapshot>

    /// The outcome of one write.
    public struct Change: Sendable, Equatable {
        /// The state after the write.
        public let snapshot: TokenSnapshot
        /// Whether the write changed the token (and so bumped the version).
        public let changed: Bool
    }

    /// Creates the service around `manager`, whose current token becomes version `version`
    /// (0 for a fresh start).
    public init(manager: PushTokenManager, version: UInt64 = 0) {
        self.manager = manager
        self.state = Locked(TokenSnapshot(version: version, token: manager.token))
    }

    /// The current snapshot.
    public var snapshot: TokenSnapshot {
        state.withLock { $0 }
    }

    /// Calls `didRegister(deviceToken:)` with `deviceToken` (1 or more bytes; the caller has
    /// validated the length) and reports whether the token changed.
    public func register(deviceToken: [UInt8]) -> Change {
        write { $0.didRegister(deviceToken: Data(deviceToken)) }
    }

    /// Calls `didFailToRegister(error:)` with `error` and reports whether a token was cleared.
    public func fail(error: any Error) -> Change {
        write { $0.didFailToRegister(error: error) }
    }

    private func write(_ body: (PushTokenManager) -> Void) -> Change {
        state.withLock { snapshot in
            let before = manager.token
            body(manager)
            let after = manager.token
            guard after != before else { return Change(snapshot: snapshot, changed: false) }
            snapshot = TokenSnapshot(version: snapshot.version + 1, token: after)
            return Change(snapshot: snapshot, changed: true)
        }
    }
}

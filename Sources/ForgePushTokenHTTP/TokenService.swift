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
/// With a `StateFile`, every change is written to it durably inside the same critical section,
/// before the write returns (so before the request is answered): an acknowledged change is a
/// durable one. A write that fails leaves the change in memory, reports `saveFailure` and marks
/// the service `degraded` until a later write succeeds; while degraded, a write that changes
/// nothing (a client retrying the same token) saves the current state again and reports the
/// outcome the same way.
///
/// Thread-safety: all members may be called from any thread.
public final class TokenService: Sendable {
    /// The manager the service drives; its `tokenStream` feeds the event stream.
    public let manager: PushTokenManager
    private let state: Locked<State>
    private let stateFile: StateFile?

    struct State: Sendable {
        var snapshot: TokenSnapshot
        var degraded = false
    }

    /// The outcome of one write.
    public struct Change: Sendable, Equatable {
        /// The state after the write.
        public let snapshot: TokenSnapshot
        /// Whether the write changed the token (and so bumped the version).
        public let changed: Bool
        /// The state file's error when the state could not be saved (the change is kept in
        /// memory); `nil` when it was saved, when nothing needed saving, or when there is no
        /// state file.
        public var saveFailure: StateFile.Failure? = nil
    }

    /// Creates the service around `manager`, whose current token becomes version `version`
    /// (0 for a fresh start), saving every change to `stateFile` when given.
    public init(manager: PushTokenManager, version: UInt64 = 0, stateFile: StateFile? = nil) {
        self.manager = manager
        self.stateFile = stateFile
        self.state = Locked(State(snapshot: TokenSnapshot(version: version, token: manager.token)))
    }

    /// Creates the service from a state file: the manager is given the saved token (if any) and
    /// the service continues from the saved version, so ids keep growing across restarts. A
    /// missing file is a first start (version 0, no token).
    /// - Throws: `StateFile.Failure` when the file exists but cannot be read or parsed.
    public convenience init(manager: PushTokenManager, restoringFrom stateFile: StateFile) throws(StateFile.Failure) {
        let saved = try stateFile.load()
        if let token = saved?.token, let bytes = DeviceTokenHex.decode(token) {
            manager.didRegister(deviceToken: Data(bytes))
        }
        self.init(manager: manager, version: saved?.version ?? 0, stateFile: stateFile)
    }

    /// The current snapshot.
    public var snapshot: TokenSnapshot {
        state.withLock { $0.snapshot }
    }

    /// The current version alone (cheaper than `snapshot`: nothing is copied or retained).
    public var version: UInt64 {
        state.withLock { $0.snapshot.version }
    }

    /// Whether the service saves its changes to a state file.
    public var savesState: Bool { stateFile != nil }

    /// Whether the last attempt to save a change to the state file failed (until one succeeds).
    public var isDegraded: Bool {
        state.withLock { $0.degraded }
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
        state.withLock { state in
            let before = manager.token
            body(manager)
            let after = manager.token
            guard after != before else {
                // Unchanged, but the last change was never saved: a client retrying after a 503
                // state_not_saved must not hear that all is well while it is not. Try again.
                var change = Change(snapshot: state.snapshot, changed: false)
                if state.degraded, let stateFile {
                    do throws(StateFile.Failure) {
                        try stateFile.save(.init(token: after, version: state.snapshot.version))
                        state.degraded = false
                    } catch {
                        change.saveFailure = error
                    }
                }
                return change
            }
            // Saturating: a hand-made state file may start next to 2^64 - 1, and no version may
            // then trap the process or be written in a form the next start refuses.
            let version = state.snapshot.version == .max ? .max : state.snapshot.version + 1
            state.snapshot = TokenSnapshot(version: version, token: after)
            var change = Change(snapshot: state.snapshot, changed: true)
            if let stateFile {
                do throws(StateFile.Failure) {
                    try stateFile.save(.init(token: after, version: state.snapshot.version))
                    state.degraded = false
                } catch {
                    state.degraded = true
                    change.saveFailure = error
                }
            }
            return change
        }
    }
}

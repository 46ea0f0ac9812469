import ForgePushTokenTestSupport
import Foundation
import Testing

@testable import ForgePushToken

/// Issue 46, point 2: `signOut() async` waits for the sign-out to settle and says how it went; a
/// sign-out then a sign-in send the deletion, then the upload. On a manual clock and a scripted
/// backend: nothing sleeps.
@Suite("Awaiting a sign-out", hangGuard())
struct SignOutTests {
    typealias Harness = TokenUploadTests.Harness

    /// A task running `await manager.signOut()`, and whether it has returned.
    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    struct Waiting {
        let returned = Locked(false)
        let task: Task<PushTokenManager.SignOutOutcome, Never>

        init(_ manager: PushTokenManager) {
            let returned = returned
            task = Task {
                let outcome = await manager.signOut()
                returned.withLock { $0 = true }
                return outcome
            }
        }

        var hasReturned: Bool { returned.withLock { $0 } }
        var outcome: PushTokenManager.SignOutOutcome { get async { await value(of: task) } }
    }

    /// A harness whose server holds `0xa`, acknowledged.
    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    static func holdingA() async throws -> Harness {
        let harness = Harness()
        harness.manager.didRegister(deviceToken: token(0xa))
        try #require(await harness.backend.nextCall()).succeed()
        await waitUntil(#"harness.record.load()?.token == hex(0xa)"#) { harness.record.load()?.token == hex(0xa) }
        return harness
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func anAwaitedSignOutReturnsDeletedOnceTheServerAcknowledgedIt() async throws {
        let harness = try await Self.holdingA()
        let waiting = Waiting(harness.manager)
        let signOut = try #require(await harness.backend.nextCall())
        #expect(signOut.request.isSignOut)
        #expect(signOut.request.serverToken == hex(0xa))
        #expect(!waiting.hasReturned)  // the deletion is in flight: the caller still waits
        signOut.succeed()
        #expect(await waiting.outcome == .deleted)
        #expect(harness.record.load()?.token == nil)
        #expect(harness.record.load()?.uploadsPaused == true)
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func anAwaitedSignOutWithNothingOnTheServerSendsNothing() async throws {
        let harness = Harness()
        await waitUntil(#"!harness.manager.uploaderMailboxes.isEmpty"#) { !harness.manager.uploaderMailboxes.isEmpty }
        #expect(await harness.manager.signOut() == .nothingToDelete)
        #expect(harness.backend.requests.isEmpty)
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func anAwaitedSignOutThatIsGivenUpSaysSo() async throws {
        let harness = try await Self.holdingA()
        let waiting = Waiting(harness.manager)
        try #require(await harness.backend.nextCall()).answer(.giveUp)
        #expect(await waiting.outcome == .gaveUp)
        #expect(harness.record.load()?.token == hex(0xa))  // still owed
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func cancellingTheCallerEndsTheWaitButNotTheSignOut() async throws {
        let harness = try await Self.holdingA()
        let waiting = Waiting(harness.manager)
        let signOut = try #require(await harness.backend.nextCall())
        waiting.task.cancel()
        #expect(await waiting.outcome == .cancelled)
        signOut.succeed()  // the sign-out itself goes on
        await waitUntil(#"harness.record.load()?.token == nil"#) { harness.record.load()?.token == nil }
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func anUploadCallThatEndsFirstEndsTheWaitWithCancelled() async throws {
        let harness = try await Self.holdingA()
        let waiting = Waiting(harness.manager)
        _ = try #require(await harness.backend.nextCall())
        await harness.stop()
        #expect(await waiting.outcome == .cancelled)
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func anAwaitedSignOutDuringAnUploadInFlightWaitsForItThenDeletesWhatItPut() async throws {
        let harness = Harness()
        harness.manager.didRegister(deviceToken: token(0xa))
        let inFlight = try #require(await harness.backend.nextCall())
        let waiting = Waiting(harness.manager)
        await waitUntil(#"harness.manager.uploaderMailboxes.first?.hasNews == true"#) {
            harness.manager.uploaderMailboxes.first?.hasNews == true
        }
        #expect(!waiting.hasReturned)
        inFlight.succeed()
        let signOut = try #require(await harness.backend.nextCall())
        #expect(signOut.request.isSignOut)
        #expect(signOut.request.serverToken == hex(0xa))
        #expect(!waiting.hasReturned)
        signOut.succeed()
        #expect(await waiting.outcome == .deleted)
        #expect(harness.backend.maximumInFlight == 1)
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func anAwaitedSignOutBeforeAnyUploadCallWaitsForTheFirstOne() async throws {
        let manager = PushTokenManager(logHandler: silent)
        manager.didRegister(deviceToken: token(0xa))
        let record = MemoryServerRecordStore(
            ServerRecord(token: hex(0xa), environment: .development, acknowledged: nil, uploadsPaused: false))
        let waiting = Waiting(manager)
        await waitUntil(#"manager.signOutWaiterCount == 1"#) { manager.signOutWaiterCount == 1 }
        #expect(!waiting.hasReturned)
        let harness = Harness(record: record, manager: manager)
        let signOut = try #require(await harness.backend.nextCall())
        #expect(signOut.request.isSignOut)
        signOut.succeed()
        #expect(await waiting.outcome == .deleted)
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func aSignOutThenASignInInQuickSuccessionSendTheDeletionThenTheUpload() async throws {
        let harness = try await Self.holdingA()
        // Both before the loop takes either: the last one must not win alone.
        signOutNow(harness.manager)
        harness.manager.resumeUploads()
        let deletion = try #require(await harness.backend.nextCall())
        #expect(deletion.request.isSignOut)
        #expect(deletion.request.serverToken == hex(0xa))
        deletion.succeed()
        let upload = try #require(await harness.backend.nextCall())
        #expect(!upload.request.isSignOut)
        #expect(upload.request.token == hex(0xa))
        #expect(upload.request.serverToken == nil)
        upload.succeed()
        await waitUntil(#"harness.record.load()?.token == hex(0xa)"#) { harness.record.load()?.token == hex(0xa) }
        #expect(harness.record.load()?.uploadsPaused == false)
        #expect(harness.backend.values == [hex(0xa), nil, hex(0xa)])
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func aSignInDuringTheSignOutsRetryWaitsForTheDeletion() async throws {
        let harness = try await Self.holdingA()
        let waiting = Waiting(harness.manager)
        try #require(await harness.backend.nextCall()).answer(.retry(after: .seconds(30)))
        #expect(await harness.nextSleep() == .seconds(30))
        harness.manager.resumeUploads()  // does not cut the sign-out's wait short
        harness.manager.didRegister(deviceToken: token(0xb))
        await harness.waitUntilPending(hex(0xb))
        #expect(harness.backend.waitingCount == 0)
        harness.clock.advance(by: .seconds(30))
        let again = try #require(await harness.backend.nextCall())
        #expect(again.request.isSignOut)
        #expect(again.request.serverToken == hex(0xa))
        again.succeed()
        #expect(await waiting.outcome == .deleted)
        let upload = try #require(await harness.backend.nextCall())
        #expect(upload.request.token == hex(0xb))
        #expect(!upload.request.isSignOut)
        upload.succeed()
        await harness.stop()
    }

    @Test func outcomesAreOrderedFromBestToWorst() {
        typealias Outcome = PushTokenManager.SignOutOutcome
        #expect(
            [Outcome.gaveUp, .deleted, .cancelled, .nothingToDelete].sorted() == [
                .nothingToDelete, .deleted, .cancelled, .gaveUp,
            ])
    }
}

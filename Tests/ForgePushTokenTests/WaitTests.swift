import ForgePushTokenTestSupport
import Testing

/// The tests' one wait (`waitUntil`, Tests/TestSupport): it returns once its condition holds, and
/// when its bound passes it fails the test with a message naming what it waited for, instead of
/// hanging (docs/testing.md, "Waiting in tests").
@Suite("the tests' bounded wait", hangGuard())
struct WaitTests {
    /// Whether `issue` is the wait's failure naming `what`.
    static func namesWhatItWaitedFor(_ issue: Issue, _ what: String) -> Bool {
        issue.comments.contains { $0.rawValue.contains("for \(what), in vain") }
    }

    @Test("a condition that holds ends the wait, with no failure")
    func holds() {
        var looks = 0
        let held = waitUntil("the third look") {
            looks += 1
            return looks == 3
        }
        #expect(held && looks == 3)
    }

    @Test("in async code, a condition that holds ends the suspending wait, with no failure")
    func holdsAsync() async {
        var looks = 0
        let held = await waitUntil("the third look") {
            await Task.yield()
            looks += 1
            return looks == 3
        }
        #expect(held && looks == 3)
    }

    @Test("a condition that never holds fails the test naming what it waited for, and returns false")
    func neverHolds() async {
        withKnownIssue {
            #expect(!waitUntil("the blocking form's event", within: 0.05) { false })
        } matching: {
            Self.namesWhatItWaitedFor($0, "the blocking form's event")
        }
        await withKnownIssue {
            #expect(await !waitUntil("the async form's event", within: 0.05) { false })
        } matching: {
            Self.namesWhatItWaitedFor($0, "the async form's event")
        }
    }

    @Test("an error the condition throws ends the wait and is rethrown")
    func errorEndsTheWait() {
        struct Thrown: Error {}
        #expect(throws: Thrown.self) { try waitUntil("a throwing condition") { throw Thrown() } }
    }
}

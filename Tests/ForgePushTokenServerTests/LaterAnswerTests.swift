import Dispatch
import ForgePushToken
import ForgePushTokenOwner
import ForgePushTokenOwnerTestSupport
import ForgePushTokenTestSupport
import HTTPServing
import MicroHTTPDServer
import ServerSupport
import Testing
import TokenService

#if canImport(Glibc)
    import Glibc
#endif

extension LiveServerTests {
    /// A write whose store answers on its own thread, later: the request's connection is suspended
    /// until the answer arrives (as a shared store's will be), and nothing else waits for it.
    @Suite("Answers decided later")
    struct LaterAnswerTests {
        @Test("a write in flight is answered when the store decides; reads and streams go on meanwhile")
        func writeAnsweredLater() throws {
            // The store holds the write until the test lets it go: what happens meanwhile is shown
            // by events, not by how long anything took (a timing bound failed under the sanitizers).
            let store = ScriptedStore(answering: .whenReleased)
            let live = try LiveServer(store: store, accessLog: false)
            let subscriber = try live.client()
            defer { subscriber.close() }
            try subscriber.send("GET /token/stream HTTP/1.1\r\nHost: x\r\n\r\n")
            #expect(try subscriber.readHead().0 == 200)
            let writer = try live.client()
            defer { writer.close() }
            try writer.send("POST /register HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nabcd")
            waitUntil("the write to reach the store") { store.heldCount == 1 }
            // While the write is held by the store, GET /token is answered, with the old value.
            let read = try live.request("GET", "/token")
            #expect(read.status == 200 && read.text == #"{"token":null}"#)
            #expect(store.heldCount == 1, "the read was answered only after the write")
            #expect(store.release())
            let answer = try writer.readResponse(method: "POST")
            #expect(answer.status == 200 && answer.text == #"{"changed":true,"token":"abcd"}"#)
            // The same connection carries on (keep-alive), and the subscriber got the change.
            #expect(try writer.request("GET", "/token").text == #"{"token":"abcd"}"#)
            let stream = try subscriber.readStream(until: "id: 1")
            #expect(stream.contains(#"data: {"token":"abcd"}"#))
        }

        @Test("a store that cannot decide: 503 store_unavailable with Retry-After, nothing changed")
        func storeUnavailable() throws {
            let live = try LiveServer(
                store: ScriptedStore(answering: .after(.milliseconds(10)), outcome: .unavailable(reason: "down")))
            let response = try live.request("POST", "/register", body: Array("abcd".utf8))
            #expect(response.status == 503)
            #expect(response.headers["retry-after"] == "1")
            #expect(response.text.contains(#""error":"store_unavailable""#))
            #expect(try live.request("GET", "/token").text == #"{"token":null}"#)
        }
    }
}

import HTTPServing
import ServerSupport
import Testing

@testable import MicroHTTPDServer

/// Issue 31: a request's slot holds a typed value (`RequestSlot`); every case round-trips through
/// the word libmicrohttpd keeps, and a context's retain passes in and out exactly once.
@Suite struct RequestSlotTests {
    /// `slot` in a few words, so that values compare as text.
    func describe(_ slot: RequestSlot) -> String {
        switch slot {
        case .empty: "empty"
        case .flawedTarget(let flaw): "flawedTarget \(flaw)"
        case .cachedRead(let mark): "cachedRead \(mark.isHead) \(mark.status)"
        case .context(let context): "context \(context.method) \(context.path)"
        }
    }

    @Test("every flawed target and every cached-read mark round-trips, and none reads as a context")
    func inlineCasesRoundTrip() {
        var values: [RequestSlot] = [.empty]
        values += TargetFlaw.allCases.map { .flawedTarget($0) }
        for isHead in [false, true] {
            values += CachedReadStatus.allCases.map { .cachedRead(CachedReadMark(isHead: isHead, status: $0)) }
        }
        var words = Set<UInt>()
        for value in values {
            let word = value.word
            #expect(describe(RequestSlot(word: word)) == describe(value))
            words.insert(UInt(bitPattern: word))
        }
        #expect(words.count == values.count, "each value has its own word")
    }

    @Test("a context is retained by the slot while it holds it, and released when taken")
    func contextOwnership() {
        let slot = UnsafeMutablePointer<UnsafeMutableRawPointer?>.allocate(capacity: 1)
        defer { slot.deallocate() }
        slot.initialize(to: nil)
        weak var watched: RequestContext?
        do {
            let context = RequestContext(
                method: "POST", path: "/register", chunked: false, origin: nil, crossOrigin: CrossOriginPolicy(),
                limit: 16, started: .now)
            watched = context
            RequestSlot.context(context).store(in: slot)
        }
        #expect(watched != nil, "the slot keeps the context alive")
        #expect(describe(RequestSlot(word: slot.pointee)) == "context POST /register")
        do {
            let taken = RequestSlot.take(from: slot)
            #expect(describe(taken) == "context POST /register")
            #expect(slot.pointee == nil)
        }
        #expect(watched == nil, "taken and dropped: released")
    }

    @Test("the URI-log callback's flaws: too long, %00, %2F, a space; nothing for a clean target")
    func targetFlaws() {
        #expect(targetFlaw("/token", limit: 64) == nil)
        #expect(targetFlaw("/token?x=%2F", limit: 64) == nil, "in the query, %2F is data")
        #expect(targetFlaw("/token%2Fstream", limit: 64) == .encodedSlash)
        #expect(targetFlaw("/token%00", limit: 64) == .encodedNUL)
        #expect(targetFlaw("/to ken", limit: 64) == .malformed)
        #expect(targetFlaw("/" + String(repeating: "a", count: 64), limit: 64) == .tooLong)
    }
}

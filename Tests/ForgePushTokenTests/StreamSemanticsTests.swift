import ForgePushTokenTestSupport
import Foundation
import Testing

@testable import ForgePushToken

/// Rules 2, 3, 4 and 7, step-locked: each step performs one action and takes one element.
@Suite("Stream semantics", hangGuard())
struct StreamSemanticsTests {
    let a = token(0xa), b = token(0xb)

    @Test func freshManagerHasNoToken() async {
        let manager = PushTokenManager(logHandler: silent)
        #expect(manager.token == nil)
        #expect(await next(manager.tokenStream) == .some(nil))
    }

    /// Rules 3 and 4: distinct until changed; the current value comes first.
    @Test func emitsOnlyActualChanges() async throws {
        let manager = PushTokenManager(logHandler: silent)
        let stream = manager.tokenStream
        var iterator = stream.makeAsyncIterator()
        #expect(await iterator.next() == .some(nil))

        manager.didRegister(deviceToken: a)
        #expect(manager.token == hex(0xa))
        #expect(await iterator.next() == .some(hex(0xa)))

        manager.didRegister(deviceToken: a)  // the same token: nothing (proved below)
        manager.didRegister(deviceToken: b)
        #expect(await iterator.next() == .some(hex(0xb)))

        manager.didFailToRegister(error: TestError(description: "first"))
        #expect(manager.token == nil)
        #expect(await iterator.next() == .some(nil))

        manager.didRegister(deviceToken: a)
        #expect(await iterator.next() == .some(hex(0xa)))

        // The same token again: nothing is emitted, and the token stays.
        let same = await expectNoEmission(
            setUp: { $0.didRegister(deviceToken: a) },
            from: { $0.didRegister(deviceToken: token(0xa)) })
        #expect(same == hex(0xa))

        // A failure while a failure already cleared the token: nothing.
        let cleared = await expectNoEmission(
            setUp: {
                $0.didRegister(deviceToken: a)
                $0.didFailToRegister(error: TestError(description: "first"))
            },
            from: { $0.didFailToRegister(error: TestError(description: "second")) })
        #expect(cleared == nil)
    }

    /// Rule 3: a failure on a fresh manager leaves `nil` and emits nothing.
    @Test func failureWithoutTokenEmitsNothing() async throws {
        let token = await expectNoEmission(
            from: { $0.didFailToRegister(error: TestError(description: "no token yet")) })
        #expect(token == nil)
    }

    /// Rule 2: an empty token is rejected: logged, no state change, no emission.
    @Test func emptyTokenIsRejected() async throws {
        let log = LogRecorder()
        let manager = PushTokenManager(logHandler: log.handler)
        manager.didRegister(deviceToken: Data())
        #expect(manager.token == nil)

        let token = await expectNoEmission(
            logHandler: log.handler,
            setUp: { $0.didRegister(deviceToken: a) },
            from: { $0.didRegister(deviceToken: Data()) })
        #expect(token == hex(0xa))
        #expect(
            log.recorded
                == Array(repeating: .init(level: .warning, message: "rejected an empty device token"), count: 2))
    }

    /// Rule 4: a new subscription starts with the value current when it subscribed.
    @Test func newSubscriptionStartsWithCurrentValue() async {
        let manager = PushTokenManager(logHandler: silent)
        let before = manager.tokenStream
        manager.didRegister(deviceToken: a)
        let after = manager.tokenStream
        #expect(await next(after) == .some(hex(0xa)))
        // `before` got nil first, replaced in its one-value buffer by A (rule 6).
        #expect(await next(before) == .some(hex(0xa)))
        manager.didFailToRegister(error: TestError(description: "x"))
        #expect(await next(manager.tokenStream) == .some(nil))
    }

    /// Rule 7: two loops over two reads of `tokenStream`, in two tasks, both see every value.
    @Test func twoSubscribersBothSeeEveryValue() async {
        var manager: PushTokenManager? = PushTokenManager(logHandler: silent)
        let (acks, ack) = AsyncStream.makeStream(of: Int.self)
        func consume(_ stream: AsyncStream<String?>, reader: Int) -> Task<[String?], Never> {
            Task {
                var seen: [String?] = []
                for await value in stream {
                    seen.append(value)
                    ack.yield(reader)
                }
                return seen
            }
        }
        let first = consume(manager!.tokenStream, reader: 1)
        let second = consume(manager!.tokenStream, reader: 2)
        var ackIterator = acks.makeAsyncIterator()
        func bothReceived() async {
            var readers: [Int] = [await ackIterator.next()!, await ackIterator.next()!]
            readers.sort()
            #expect(readers == [1, 2])
        }

        await bothReceived()  // the initial nil
        manager!.didRegister(deviceToken: a)
        await bothReceived()
        manager!.didRegister(deviceToken: b)
        await bothReceived()
        manager!.didFailToRegister(error: TestError(description: "x"))
        await bothReceived()
        manager!.didRegister(deviceToken: a)
        await bothReceived()
        manager = nil  // finishes both streams (rule 8)

        let expected: [String?] = [nil, hex(0xa), hex(0xb), nil, hex(0xa)]
        #expect(await value(of: first) == expected)
        #expect(await value(of: second) == expected)
    }

    /// Waiting for the first token works whether it was registered before or after the wait began.
    @Test func firstTokenRegisteredBeforeWaiting() async {
        let manager = PushTokenManager(logHandler: silent)
        manager.didRegister(deviceToken: a)
        #expect(await manager.tokenStream.first { $0 != nil } == .some(hex(0xa)))
        #expect(manager.subscriberCount == 0)
    }

    @Test func firstTokenRegisteredAfterWaiting() async {
        let manager = PushTokenManager(logHandler: silent)
        let waiter = Task { await manager.tokenStream.first { $0 != nil } }
        await waitUntil(#"manager.subscriberCount == 1"#) { manager.subscriberCount == 1 }
        manager.didFailToRegister(error: TestError(description: "not yet"))
        manager.didRegister(deviceToken: b)
        #expect(await value(of: waiter) == .some(hex(0xb)))
        #expect(manager.subscriberCount == 0)
    }
}

import ServerSupport
import Testing

@testable import MicroHTTPDServer

/// A connection's deadline box lives from its acceptance to its close, held by the connection's
/// socket context: an event stream's `forget` only takes it out of the sweep, and the close
/// releases it, once.
@Suite struct ConnectionDeadlinesTests {
    @Test("the box lives until the close, through a stream's forget, and no longer")
    func boxLifetime() {
        let deadlines = ConnectionDeadlines()
        weak var box: AnyObject?
        let context = deadlines.register(1, fd: -1, at: .now)
        box = Unmanaged<AnyObject>.fromOpaque(context).takeUnretainedValue()
        #expect(box != nil)
        #expect(deadlines.sweptConnections == 1)
        deadlines.forget(1)
        #expect(box != nil, "an event stream's connection still holds its box in its socket context")
        #expect(deadlines.sweptConnections == 0, "but the sweep no longer sees it")
        deadlines.completed(1, entry: Unmanaged.fromOpaque(context), at: .now)
        #expect(deadlines.sweptConnections == 1, "the stream's request is over: the sweep sees it again")
        deadlines.unregister(1, context: context)
        #expect(box == nil, "the close released the last reference")
        #expect(deadlines.sweptConnections == 0)
    }

    @Test("the sweep sees each open connection's box, not a closed one's")
    func sweep() {
        let deadlines = ConnectionDeadlines()
        let first = deadlines.register(1, fd: 7, at: .now)
        let second = deadlines.register(2, fd: 8, at: .now)
        deadlines.unregister(1, context: first)
        // A head not in by then is due once (the sweep expires it).
        #expect(deadlines.due(at: .now + .seconds(3600), timeout: .seconds(1)).map(\.fd) == [8])
        deadlines.unregister(2, context: second)
        #expect(deadlines.due(at: .now + .seconds(7200), timeout: .seconds(1)).isEmpty)
    }
}

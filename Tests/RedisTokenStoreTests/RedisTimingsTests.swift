import ServerSupport
import Testing

@testable import RedisTokenStore

/// The Redis timings: their defaults are written once (`RedisLinkStateMachine.Timings`), and the
/// store's configuration reads and writes them there.
@Suite("Redis timings")
struct RedisTimingsTests {
    @Test("the configuration's defaults are the link's, and a setting reaches the link")
    func oneDefinition() throws {
        var configuration = RedisTokenStore.Configuration(endpoint: try RedisEndpoint.parse("redis://127.0.0.1:6379"))
        #expect(configuration.timings == RedisLinkStateMachine.Timings())
        #expect(configuration.heartbeatInterval == 1 && configuration.heartbeatTimeout == 3)
        #expect(configuration.checkInterval == 2 && configuration.refreshInterval == 0.1)
        #expect(configuration.probeInterval == 5)
        configuration.probeInterval = 17
        configuration.heartbeatTimeout = 9
        #expect(configuration.timings.probeInterval == 17 && configuration.timings.heartbeatTimeout == 9)
    }
}

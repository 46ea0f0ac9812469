import ForgePushToken
import ForgePushTokenOwner
import ForgePushTokenOwnerTestSupport
import Foundation
import HTTPServing
import ServerSupport
import Testing

@testable import TokenService

/// The HTTP side of the replica mode (docs/replicas.md): /healthz with the store's field, stale and
/// not-yet-read token reads, the stream's retry: preamble and Last-Event-ID floor.
@Suite struct ReplicaModeTests {
    static func responder(refreshes: Locked<Int> = Locked(0)) -> (Responder, ScriptedStore) {
        let store = ScriptedStore()
        let owner = TokenOwner<TokenSnapshot>(
            store: store, initial: .initial, health: .starting(reason: HealthReason(rawValue: "unreachable")),
            maxSubscribers: 64)
        owner.start()
        let mode = ReplicaMode(
            name: "redis", refresh: { refreshes.withLock { $0 += 1 } },
            metrics: { "forge_push_token_redis_up 1\n" })
        return (Responder(owner: owner, replica: mode), store)
    }

    static func get(_ responder: Responder, _ path: String, headers: HTTPHeaders = HTTPHeaders()) -> HTTPResponse? {
        if case .response(let response) = responder.respond(
            to: HTTPRequest(method: "GET", path: path, query: nil, headers: headers))
        {
            return response
        }
        return nil
    }

    static func json(_ response: HTTPResponse?) -> [String: String] {
        (response.flatMap { try? JSONSerialization.jsonObject(with: Data($0.body)) as? [String: String] }) ?? [:]
    }

    /// A store shared by replicas brings the mode through `TokenStore` (no cast in main): its
    /// name, refresh and metrics; a store the process has alone brings none.
    @Test func theModeComesFromTheStore() throws {
        #expect(ReplicaMode(store: MemoryTokenStore()) == nil)
        let shared = SharedStore()
        let mode = try #require(ReplicaMode(store: shared))
        #expect(mode.name == "shared")
        mode.refresh()
        mode.refresh()
        #expect(shared.refreshes.withLock { $0 } == 2)
        // The store's series are values; the HTTP layer writes them (HELP, TYPE, cumulative
        // buckets, escaped label values).
        #expect(
            mode.metrics()
                == "# HELP shared_up Up.\n# TYPE shared_up gauge\nshared_up 1\n"
                + "# HELP shared_seconds Seconds.\n# TYPE shared_seconds histogram\n"
                + "shared_seconds_bucket{le=\"0.5\"} 1\nshared_seconds_bucket{le=\"1.0\"} 3\n"
                + "shared_seconds_bucket{le=\"+Inf\"} 4\nshared_seconds_sum 3.75\nshared_seconds_count 4\n"
                + "# HELP shared_info Info.\n# TYPE shared_info gauge\nshared_info{at=\"a\\\"b\"} 1\n")
    }

    @Test func healthTokenReadsAndMetricsFollowTheStore() {
        let (responder, store) = Self.responder()
        let starting = Self.get(responder, "/healthz")
        #expect(starting?.status == 503 && Self.json(starting) == ["status": "starting", "redis": "unreachable"])
        let early = Self.get(responder, "/token")
        #expect(early?.status == 503 && early?.headers["Retry-After"] == "1")
        #expect(Self.json(early)["error"] == "store_unavailable")
        #expect(!responder.answersCachedReadsBlindly)
        let (refused, subscriber) = responder.streams.open(
            for: AdmittedRequest(
                route: .stream, request: HTTPRequest(method: "GET", path: "/token/stream", query: nil)),
            wake: {})
        #expect(refused.status == 503 && subscriber == nil)

        store.report(.changed(TokenState(version: 4, token: "abcd")))
        store.report(.health(.ok))
        let ok = Self.get(responder, "/healthz")
        #expect(ok?.status == 200 && Self.json(ok) == ["status": "ok", "redis": "connected"])
        let fresh = Self.get(responder, "/token")
        #expect(fresh?.status == 200 && fresh?.headers["Token-Stale"] == nil)
        #expect(responder.answersCachedReadsBlindly)

        store.report(.health(.degraded(reason: HealthReason(rawValue: "unreachable"))))
        let degraded = Self.get(responder, "/healthz")
        #expect(degraded?.status == 200 && Self.json(degraded) == ["status": "degraded", "redis": "unreachable"])
        let stale = Self.get(responder, "/token")
        #expect(stale?.status == 200 && stale?.headers["Token-Stale"] == "true" && Self.json(stale)["token"] == "abcd")
        #expect(!responder.answersCachedReadsBlindly)
        let metrics = Self.get(responder, "/metrics").map { String(decoding: $0.body, as: UTF8.self) } ?? ""
        #expect(metrics.hasSuffix("forge_push_token_redis_up 1\n"))
    }

    @Test func streamsStartWithARandomRetryAndRespectLastEventID() throws {
        let refreshes = Locked(0)
        let (responder, store) = Self.responder(refreshes: refreshes)
        store.report(.changed(TokenState(version: 2, token: "aa")))
        store.report(.health(.ok))
        var retries = Set<Int>()
        for _ in 0..<20 {
            let (_, subscriber) = responder.streams.open(
                for: AdmittedRequest(
                    route: .stream, request: HTTPRequest(method: "GET", path: "/token/stream", query: nil)),
                wake: {})
            let text = String(decoding: drain(try #require(subscriber).subscriber).bytes, as: UTF8.self)
            #expect(text.hasPrefix("retry: "))
            let value = Int(text.dropFirst(7).prefix(while: { $0.isNumber }))!
            #expect((1000...5000).contains(value))
            retries.insert(value)
            #expect(text.contains("id: 2\n"))
        }
        #expect(retries.count > 1)
        #expect(refreshes.withLock { $0 } == 0)

        var headers = HTTPHeaders()
        headers.add("Last-Event-ID", "5")
        let (_, aheadSubscriber) = responder.streams.open(
            for: AdmittedRequest(
                route: .stream,
                request: HTTPRequest(
                    method: "GET", path: "/token/stream", query: nil,
                    headers: headers)),
            wake: {})
        #expect(refreshes.withLock { $0 } == 1)
        let ahead = try #require(aheadSubscriber).subscriber
        let first = drain(ahead)
        #expect(!String(decoding: first.bytes, as: UTF8.self).contains("id:"))
        store.report(.changed(TokenState(version: 4, token: "bb")))
        #expect(!String(decoding: drain(ahead).bytes, as: UTF8.self).contains("id:"))
        store.report(.changed(TokenState(version: 5, token: "cc")))
        #expect(String(decoding: drain(ahead).bytes, as: UTF8.self).contains("id: 5\n"))
    }

    @Test func lastEventIDParsing() {
        #expect(ReplicaMode.lastEventID("17") == 17)
        for bad in [nil, "", "-1", "1a", " 1", "99999999999999999999999"] {
            #expect(ReplicaMode.lastEventID(bad) == nil)
        }
    }
}

/// A store that says it is shared: counts refresh requests and has one metric.
private final class SharedStore: TokenStore {
    let refreshes = Locked(0)
    var ordering: CommitOrdering { .storeSerialized }
    func commit(_ token: String?, base: TokenState, completion: @escaping @Sendable (CommitOutcome) -> Void)
        -> CommitOutcome?
    {
        .unavailable(reason: "test")
    }
    func start(
        reporting report: @escaping @Sendable (TokenStoreEvent) -> Void,
        current: @escaping @Sendable () -> TokenState
    ) {}
    func stop() {}
    func refresh() { refreshes.withLock { $0 += 1 } }
    func status() -> StoreStatus {
        StoreStatus(
            sharedName: "shared",
            series: [
                .single("shared_up", .gauge, help: "Up.", .count(1)),
                .histogram(
                    "shared_seconds", help: "Seconds.", bounds: [0.5, 1], buckets: [1, 2], sum: 3.75, count: 4),
                StoreMetric(
                    "shared_info", .gauge, help: "Info.",
                    samples: [StoreMetric.Sample(labels: [StoreMetric.Label("at", "a\"b")], .count(1))]),
            ])
    }
}

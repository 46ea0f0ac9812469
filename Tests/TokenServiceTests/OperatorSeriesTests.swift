import ForgePushToken
import ForgePushTokenOwner
import ForgePushTokenOwnerTestSupport
import Foundation
import HTTPServing
import ServerSupport
import Testing

@testable import TokenService

/// The series operators' alerts read (issue 13): the standard process metrics, the build
/// information, the subscriber limit and the state file's health.
@Suite("Operator series and process metrics")
struct OperatorSeriesTests {
    /// The value of the unlabelled sample `name` in `text`, or `nil`.
    static func value(_ name: String, in text: String) -> Double? {
        for line in text.split(separator: "\n") where line.hasPrefix(name + " ") {
            return Double(line.dropFirst(name.count + 1))
        }
        return nil
    }

    /// A `/proc/<pid>/stat` line whose command name holds spaces and parentheses.
    static let stat = Array(
        "4242 (forge (push) token) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 150 0 0 20 0 5 0 12345 268435456 2048 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n"
            .utf8)

    @Test("/proc/self/stat is parsed by its field numbers, after the command name")
    func parsesStat() throws {
        let metrics = try #require(
            ProcessMetrics.parse(
                stat: Self.stat, ticksPerSecond: 100, pageSize: 4096,
                bootTime: 1_700_000_000))
        #expect(metrics.cpuSeconds == 4.0)  // (250 + 150) ticks / 100
        #expect(metrics.startTimeSeconds == 1_700_000_123.45)  // boot + 12345 ticks / 100
        #expect(metrics.virtualBytes == 268_435_456)
        #expect(metrics.residentBytes == 2048 * 4096)
    }

    @Test(
        "a truncated or garbled stat line is refused, not misread",
        arguments: [
            "4242 (x) S 1 2 3", "no parenthesis at all",
            "4242 (x) S 1 4242 4242 0 -1 4194560 900 0 0 0 abc 150 0 0 20 0 5 0 1 2 3", "",
        ])
    func refusesGarbledStat(_ line: String) {
        #expect(ProcessMetrics.parse(stat: Array(line.utf8), ticksPerSecond: 100, pageSize: 4096, bootTime: 0) == nil)
    }

    @Test("btime is found among the lines of /proc/stat")
    func parsesBootTime() {
        let text = Array("cpu  1 2 3\nintr 5\nbtime 1700000000\nprocesses 9\n".utf8)
        #expect(ProcessMetrics.parseBootTime(text) == 1_700_000_000)
        #expect(ProcessMetrics.parseBootTime(Array("cpu 1\n".utf8)) == nil)
    }

    /// Descriptors open now, listed by Foundation (its own descriptor for the listing excluded).
    static func listedDescriptors() throws -> Int {
        try FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").count - 1
    }

    /// CPU time of the whole process, from `clock_gettime(CLOCK_PROCESS_CPUTIME_ID)`.
    static func processCPUSeconds() -> Double {
        var now = timespec()
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now)
        return Double(now.tv_sec) + Double(now.tv_nsec) / 1e9
    }

    @Test("this process's metrics, read from /proc, agree with what the test can see itself")
    func readsThisProcess() throws {
        // Other tests open and close descriptors in parallel: retry until a reading falls in a
        // quiet moment, when listings before and after it agree.
        let descriptors = (0..<20).map { _ in open("/dev/null", O_RDONLY) }
        defer { for descriptor in descriptors { close(descriptor) } }
        var agreed = false
        for _ in 0..<200 where !agreed {
            let before = try Self.listedDescriptors()
            let reading = try #require(ProcessMetrics.read())
            let listed = ProcessMetrics.countOpenFileDescriptorsByListing()
            let after = try Self.listedDescriptors()
            // The count read (the size of /proc/self/fd on Linux 6.2+) and the fallback listing
            // must both match a quiet moment's listing (one that nothing changed around them).
            agreed = before == after && reading.openFileDescriptors == before && listed == before
        }
        #expect(agreed, "no quiet moment to compare the descriptor count in")
        let metrics = try #require(ProcessMetrics.read())
        #expect((metrics.openFileDescriptors ?? 0) >= 23)
        var limit = rlimit()
        getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        #expect(metrics.maxFileDescriptors == Int(limit.rlim_cur))
        // The test process started before now, and within the last hour.
        let now = Date.now.timeIntervalSince1970
        #expect(metrics.startTimeSeconds <= now + 1 && metrics.startTimeSeconds > now - 3600)
        #expect(metrics.residentBytes > 1_000_000 && metrics.virtualBytes >= metrics.residentBytes)
        // Burn 0.1 s of CPU (as the kernel counts it, whatever else runs): the counter follows,
        // to within its clock tick.
        let cpuBefore = Self.processCPUSeconds()
        let reported = metrics.cpuSeconds
        var x = 0.0
        while Self.processCPUSeconds() - cpuBefore < 0.1 { x += sin(x + 1) }
        #expect(x.isFinite)
        let later = try #require(ProcessMetrics.read())
        #expect(later.cpuSeconds >= reported + 0.08)
        #expect(later.cpuSeconds <= Self.processCPUSeconds() + 0.02)
    }

    @Test("/metrics has the standard process series, the limit, the state gauge and build info")
    func renderedSeries() {
        let metrics = ServiceMetrics()
        metrics.setBuildVersion("1.2.3-\"rc\"\\x")
        let text = metrics.render(
            subscribers: 3, events: .init(sent: 0, skipped: 0), maxSubscribers: 500,
            stateSaved: false)
        #expect(Self.value("forge_push_token_subscribers_limit", in: text) == 500)
        #expect(Self.value("forge_push_token_state_saved", in: text) == 0)
        #expect(text.contains("forge_push_token_build_info{version=\"1.2.3-\\\"rc\\\"\\\\x\"} 1\n"))
        for name in [
            "process_cpu_seconds_total", "process_resident_memory_bytes", "process_virtual_memory_bytes",
            "process_start_time_seconds", "process_open_fds", "process_max_fds",
        ] {
            #expect(Self.value(name, in: text) != nil, "\(name) missing")
            #expect(text.contains("# TYPE \(name) "), "\(name) has no TYPE")
        }
        #expect(!text.contains("forge_push_token_start_time_seconds"), "replaced by process_start_time_seconds")
        let saved = metrics.render(
            subscribers: 0, events: .init(sent: 0, skipped: 0), maxSubscribers: 1, stateSaved: true)
        #expect(Self.value("forge_push_token_state_saved", in: saved) == 1)
        // Without a state file or a version, those series are left out.
        let bare = ServiceMetrics().render(subscribers: 0, events: .init(sent: 0, skipped: 0))
        #expect(
            !bare.contains("forge_push_token_state_saved") && !bare.contains("build_info")
                && !bare.contains("subscribers_limit"))
    }

    @Test("counterValues gives the counters /metrics shows, and renderCounters writes exactly their lines")
    func counterValuesAndLines() {
        let metrics = ServiceMetrics()
        metrics.increment(.tokenChanges)
        metrics.increment(.tokenChanges)
        metrics.increment(.unauthorizedRequests)
        metrics.increment(.credentialReloadsFailed)
        let values = metrics.counterValues()
        var expected = [UInt64](repeating: 0, count: ServiceMetrics.Counter.allCases.count)
        expected[ServiceMetrics.Counter.tokenChanges.rawValue] = 2
        expected[ServiceMetrics.Counter.unauthorizedRequests.rawValue] = 1
        expected[ServiceMetrics.Counter.credentialReloadsFailed.rawValue] = 1
        #expect(values == expected)
        var lines = PrometheusText()
        ServiceMetrics.renderCounters(values, to: &lines)
        #expect(lines.text.contains("\nforge_push_token_token_changes_total 2\n"))
        #expect(lines.text.contains("\nforge_push_token_credentials_reloads_total{result=\"failed\"} 1\n"))
        #expect(lines.text.hasPrefix("# HELP forge_push_token_token_changes_total "))
        // The same lines, in the same order, inside the whole text.
        let text = metrics.render(subscribers: 0, events: .init(sent: 0, skipped: 0))
        #expect(text.contains(lines.text))
        #expect(text.components(separatedBy: "forge_push_token_token_changes_total 2\n").count == 2)
    }

    @Test("the responder reports its subscriber limit and whether the state file is saved")
    func responderSeries() throws {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("ops-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        let path = folder.appendingPathComponent("state.json").path
        let store = StateFileStore(file: StateFile(path: path))
        let owner = TokenOwner<TokenSnapshot>(store: store, initial: try store.load(), maxSubscribers: 77)
        let responder = Responder(owner: owner)
        func scrape() throws -> String {
            guard case .response(let response) = responder.respond(to: HTTPRequest(method: "GET", target: "/metrics"))
            else {
                throw Unexpected(description: "no response")
            }
            return String(decoding: response.body, as: UTF8.self)
        }
        let text = try scrape()
        #expect(Self.value("forge_push_token_subscribers_limit", in: text) == 77)
        #expect(Self.value("forge_push_token_state_saved", in: text) == 1)
        // The folder goes away: the next change cannot be saved, and the gauge says so.
        try FileManager.default.removeItem(at: folder)
        guard case .notSaved = commitAndWait(owner, "010203") else {
            Issue.record("a change with the folder gone was not refused with notSaved")
            return
        }
        #expect(Self.value("forge_push_token_state_saved", in: try scrape()) == 0)
        // Without a state file there is nothing to report.
        let open = Responder(owner: makeOwner(maxSubscribers: 5))
        guard case .response(let response) = open.respond(to: HTTPRequest(method: "GET", target: "/metrics")) else {
            Issue.record("no response")
            return
        }
        #expect(!String(decoding: response.body, as: UTF8.self).contains("forge_push_token_state_saved"))
    }
}

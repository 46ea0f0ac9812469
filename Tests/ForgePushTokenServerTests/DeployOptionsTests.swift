import HTTPServing
import ServerSupport
import Testing
import TokenService

@testable import forge_push_token_server

/// `--drain-seconds`, `--max-stream-age` and `--health-check=live|ready`
/// (../shared/spec/deploy.md; a flag out of range is a usage error: exit 64).
@Suite struct DeployOptionsTests {
    func parse(_ arguments: [String], _ environment: [String: String] = [:]) throws -> CommandLineOptions {
        try CommandLineOptions.parse(arguments, environment: environment)
    }

    @Test func defaultsAreNoDrainAndNoAgeLimit() throws {
        let options = try parse([])
        #expect(options.drainSeconds == 0 && options.maxStreamAge == 0)
        #expect(options.healthCheckProbe == .health)
    }

    @Test func drainSecondsFromFlagOrVariable() throws {
        #expect(try parse(["--drain-seconds", "10"]).drainSeconds == 10)
        #expect(try parse(["--drain-seconds=600"]).drainSeconds == 600)
        #expect(try parse(["--drain-seconds=0"]).drainSeconds == 0)
        #expect(try parse([], ["FORGE_PUSH_TOKEN_DRAIN_SECONDS": "15"]).drainSeconds == 15)
        #expect(try parse(["--drain-seconds", "5"], ["FORGE_PUSH_TOKEN_DRAIN_SECONDS": "15"]).drainSeconds == 5)
        #expect(try parse([], ["FORGE_PUSH_TOKEN_MAX_STREAM_AGE": "3600"]).maxStreamAge == 3600)
        #expect(try parse(["--max-stream-age", "60"]).maxStreamAge == 60)
        #expect(try parse(["--max-stream-age=86400"]).maxStreamAge == 86_400)
        #expect(try parse(["--max-stream-age=0"]).maxStreamAge == 0)
    }

    @Test(arguments: [
        ["--drain-seconds", "601"], ["--drain-seconds", "-1"], ["--drain-seconds", "1.5"], ["--drain-seconds", ""],
        ["--drain-seconds"], ["--max-stream-age", "59"], ["--max-stream-age", "1"], ["--max-stream-age", "86401"],
        ["--max-stream-age", "-60"], ["--health-check=maybe"], ["--health-check="], ["--health-check=LIVE"],
    ])
    func outOfRangeIsAUsageError(arguments: [String]) {
        #expect(throws: CommandLineOptions.UsageError.self) { try parse(arguments) }
    }

    @Test func aVariableOutOfRangeIsNamed() {
        #expect {
            try parse([], ["FORGE_PUSH_TOKEN_DRAIN_SECONDS": "900"])
        } throws: { error in
            (error as? CommandLineOptions.UsageError)?.description.contains("FORGE_PUSH_TOKEN_DRAIN_SECONDS") == true
        }
        #expect {
            try parse([], ["FORGE_PUSH_TOKEN_MAX_STREAM_AGE": "30"])
        } throws: { error in
            (error as? CommandLineOptions.UsageError)?.description.contains("60 to 86400") == true
        }
    }

    @Test func healthCheckAsksTheProbeNamed() throws {
        #expect(try parse(["--health-check"]).healthCheckProbe == .health)
        let live = try parse(["--health-check=live"])
        #expect(live.action == .healthCheck && live.healthCheckProbe == .live)
        #expect(try parse(["--health-check=ready", "--port", "9"]).healthCheckProbe == .ready)
        // An optional value takes the = form only: a following word is not its value.
        #expect(throws: CommandLineOptions.UsageError.self) { try parse(["--health-check", "live"]) }
        #expect(HealthCheck.Probe.live.rawValue == "/livez" && HealthCheck.Probe.ready.rawValue == "/readyz")
    }
}

import ForgePushToken
import ForgePushTokenOwner
import ForgePushTokenTestSupport
import Foundation
import ServerSupport
import Testing

@testable import RedisTokenStore

/// A test step that could not run.
struct TLSTestError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// Runs `arguments` (a program on the PATH and its arguments) in `directory`, its output thrown
/// away, and waits for it; throws when it does not exit 0. (posix_spawn, not Foundation's
/// Process: see `RedisServerProcess`.)
func runQuietly(_ arguments: [String], in directory: String) throws {
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
    let command = ["/bin/sh", "-c", "cd \"$0\" && exec \"$@\"", directory] + arguments
    var argv: [UnsafeMutablePointer<CChar>?] = command.map { strdup($0) } + [nil]
    defer { for argument in argv { free(argument) } }
    var pid: pid_t = 0
    guard posix_spawn(&pid, "/bin/sh", &actions, nil, &argv, environ) == 0 else {
        throw TLSTestError("cannot run \(arguments[0])")
    }
    var status: Int32 = 0
    waitpid(pid, &status, 0)
    guard status == 0 else { throw TLSTestError("\(arguments.joined(separator: " ")) failed") }
}

/// Certificates made for one test with `openssl` in a fresh temporary directory (never
/// committed): a CA; a server certificate it signs for 127.0.0.1 and localhost (no extended key
/// usage); the same expired; one for another name; one signed by a second, untrusted CA; a client
/// certificate; and, for 127.0.0.1 and localhost, ones whose extended key usage allows only TLS
/// client authentication, only code signing, or TLS server authentication; and one whose only
/// name is its common name, localhost. Every private key is P-256, unencrypted.
final class TestCertificates {
    let directory: String

    init() throws {
        directory = NSTemporaryDirectory() + "fpt-tls-" + String(UInt64.random(in: 0...UInt64.max), radix: 16)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
        for ca in ["ca", "other-ca"] {
            try runQuietly(
                ["openssl", "req", "-x509"] + key + [
                    "-keyout", "\(ca).key", "-out", "\(ca).crt", "-subj", "/CN=Test \(ca)", "-days", "2",
                ], in: directory)
        }
        let names = "subjectAltName=IP:127.0.0.1,DNS:localhost"
        let signed: [(name: String, ca: String, days: String, extensions: String)] = [
            ("server", "ca", "2", names),
            ("expired", "ca", "-1", names),
            ("wrong-name", "ca", "2", "subjectAltName=DNS:other.example"),
            ("untrusted", "other-ca", "2", names),
            ("client", "ca", "2", "extendedKeyUsage=clientAuth"),
            ("client-auth-only", "ca", "2", names + "\nextendedKeyUsage=clientAuth"),
            ("code-signing-only", "ca", "2", names + "\nextendedKeyUsage=codeSigning"),
            ("server-auth", "ca", "2", names + "\nextendedKeyUsage=serverAuth"),
            // Its subject is CN=localhost (below), and it has no subject alternative name.
            ("cn-only", "ca", "2", "basicConstraints=CA:FALSE"),
        ]
        for (index, item) in signed.enumerated() {
            try item.extensions.write(toFile: directory + "/\(item.name).ext", atomically: true, encoding: .utf8)
            let subject = item.name == "cn-only" ? "/CN=localhost" : "/CN=\(item.name)"
            try runQuietly(
                ["openssl", "req"] + key + [
                    "-keyout", "\(item.name).key", "-out", "\(item.name).csr", "-subj", subject,
                ], in: directory)
            try runQuietly(
                [
                    "openssl", "x509", "-req", "-in", "\(item.name).csr", "-CA", "\(item.ca).crt", "-CAkey",
                    "\(item.ca).key", "-set_serial", String(index + 2), "-days", item.days, "-extfile",
                    "\(item.name).ext", "-out", "\(item.name).crt",
                ], in: directory)
        }
    }

    /// The path of `name` in the directory.
    func path(_ name: String) -> String { directory + "/" + name }

    /// The bytes of `name`.
    func bytes(_ name: String) throws -> [UInt8] { Array(try Data(contentsOf: URL(fileURLWithPath: path(name)))) }

    /// Trust the test CA, with the client certificate when `client`.
    func settings(client: Bool = false) throws -> RedisTLSSettings {
        RedisTLSSettings(
            caPEM: try bytes("ca.crt"), certificatePEM: client ? try bytes("client.crt") : nil,
            keyPEM: client ? try bytes("client.key") : nil)
    }

    /// `redis-server` TLS arguments serving `certificate` (`server`, `expired`...), asking for a
    /// client certificate when `clients`.
    func serverArguments(_ certificate: String = "server", clients: Bool = false) -> [String] {
        [
            "--tls-cert-file", path("\(certificate).crt"), "--tls-key-file", path("\(certificate).key"),
            "--tls-ca-cert-file", path("ca.crt"), "--tls-auth-clients", clients ? "yes" : "no",
        ]
    }

    deinit { try? FileManager.default.removeItem(atPath: directory) }
}

/// TLS to Redis (docs/replicas.md, "TLS to Redis"): `redis-server --tls-port` with certificates
/// made in the test.
@Suite(.serialized) struct LiveTLSTests {
    /// The first connection error for `endpoint` with `settings`.
    func failure(_ endpoint: RedisEndpoint, _ settings: RedisTLSSettings) -> RedisConnectionError? {
        do {
            _ = try RedisConnection(endpoint: endpoint, timeout: 2, credentials: try settings.credentials())
            return nil
        } catch let error as RedisConnectionError {
            return error
        } catch {
            return .unreachable("\(error)")
        }
    }

    @Test func replicasShareATokenOverTLS() throws {
        let certificates = try TestCertificates()
        let redis = try RedisServerProcess(
            extra: ["--requirepass", "s3cret-pass"], tls: certificates.serverArguments())
        let log = LogRecorder()
        let a = ReplicaModel(
            port: redis.port, password: "s3cret-pass", tls: try certificates.settings(), log: log.serverHandler)
        // By name as well as by IP address: the certificate names both.
        let b = ReplicaModel(
            port: redis.port, password: "s3cret-pass", host: "localhost", tls: try certificates.settings())
        waitUntil(#"a.link == "connected" && b.link == "connected""#) { a.link == "connected" && b.link == "connected" }
        #expect(a.commit("aa01") == .applied(TokenState(version: 1, token: "aa01")))
        waitUntil(#"b.current == TokenState(version: 1, token: "aa01")"#) {
            b.current == TokenState(version: 1, token: "aa01")
        }
        #expect(b.commit("bb02") == .applied(TokenState(version: 2, token: "bb02")))
        waitUntil(#"a.current == TokenState(version: 2, token: "bb02")"#) {
            a.current == TokenState(version: 2, token: "bb02")
        }
        #expect(log.recorded.contains { $0.message.hasPrefix("Redis connected at rediss://127.0.0.1:") })
        #expect(!log.recorded.contains { $0.message.contains("s3cret-pass") })
    }

    @Test func anUntrustedExpiredOrMisnamedCertificateIsRefusedAndReported() throws {
        let certificates = try TestCertificates()
        let cases: [(certificate: String, says: String)] = [
            ("untrusted", "signed by an unknown authority"),
            ("expired", "expired"),
            ("wrong-name", "name does not match 127.0.0.1"),
        ]
        for (certificate, says) in cases {
            let redis = try RedisServerProcess(tls: certificates.serverArguments(certificate))
            let endpoint = RedisEndpoint(address: .tcp(host: "127.0.0.1", port: redis.port), tls: true)
            let error = failure(endpoint, try certificates.settings())
            guard case .tlsFailed(let why) = error else {
                Issue.record("\(certificate): \(String(describing: error))")
                continue
            }
            #expect(why.contains(says) && why.contains("CN=\(certificate)"), "\(why)")
            let log = LogRecorder()
            let replica = ReplicaModel(
                port: redis.port, password: "pw-never-logged", tls: try certificates.settings(), log: log.serverHandler)
            // Waits for the events, not for a deadline (docs/testing.md, "Waiting in tests"): the
            // link's health changes before the owner hears of it and the line is logged.
            waitUntil("link tls_failed, health starting (tls_failed) and the line \"TLS failed\"") {
                replica.link == "tls_failed"
                    && replica.owner.health == .starting(reason: HealthReason(rawValue: "tls_failed"))
                    && log.recorded.contains { $0.message.contains("TLS failed") }
            }
            #expect(replica.commit("aa") == .unavailable(reason: "Redis: tls_failed"))
            let lines = log.recorded.map(\.message)
            #expect(lines.contains { $0.contains("TLS failed") && $0.contains(says) }, "\(lines)")
            #expect(lines.filter { $0.contains("TLS failed") }.count == 1, "one line per change of reason: \(lines)")
            #expect(!lines.contains { $0.contains("pw-never-logged") || $0.contains("PRIVATE KEY") })
        }
    }

    /// ../shared/spec/redis-ha.md, "What a replica trusts": a certificate with an extended key
    /// usage that does not list TLS server authentication (a client certificate from the same CA,
    /// issued for the Redis host's name, or a code-signing one) is refused, by IP address and by
    /// DNS name; so is one for a DNS host whose only name is its common name. Each is reported
    /// in the replica's log line, and the replica writes nothing.
    @Test func aCertificateNotMeantForATLSServerOrNamedOnlyByItsCNIsRefused() throws {
        let certificates = try TestCertificates()
        let purpose = "not meant for a TLS server"
        let cases: [(certificate: String, host: String, says: String)] = [
            ("client-auth-only", "127.0.0.1", purpose),
            ("client-auth-only", "localhost", purpose),
            ("code-signing-only", "127.0.0.1", purpose),
            ("code-signing-only", "localhost", purpose),
            ("cn-only", "localhost", "no DNS name among its subject alternative names"),
        ]
        for (certificate, host, says) in cases {
            let redis = try RedisServerProcess(tls: certificates.serverArguments(certificate))
            let endpoint = RedisEndpoint(address: .tcp(host: host, port: redis.port), tls: true)
            let error = failure(endpoint, try certificates.settings())
            guard case .tlsFailed(let why) = error else {
                Issue.record("\(certificate) for \(host) was not refused: \(String(describing: error))")
                continue
            }
            let subject = certificate == "cn-only" ? "CN=localhost" : "CN=\(certificate)"
            #expect(why.contains(says) && why.contains(subject), "\(certificate) for \(host): \(why)")
            let log = LogRecorder()
            let replica = ReplicaModel(
                port: redis.port, host: host, tls: try certificates.settings(), log: log.serverHandler)
            waitUntil("link tls_failed and the line \"TLS failed\"") {
                replica.link == "tls_failed" && log.recorded.contains { $0.message.contains("TLS failed") }
            }
            #expect(replica.commit("aa") == .unavailable(reason: "Redis: tls_failed"))
            let lines = log.recorded.map(\.message)
            #expect(lines.contains { $0.contains("TLS failed") && $0.contains(says) }, "\(lines)")
        }
    }

    /// The same checks accept a server certificate without an extended key usage, and one whose
    /// extended key usage lists TLS server authentication, by IP address and by DNS name (each
    /// listed in its subject alternative names).
    @Test func aServerCertificateWithServerAuthOrWithoutAnExtendedKeyUsageIsAccepted() throws {
        let certificates = try TestCertificates()
        for certificate in ["server", "server-auth"] {
            let redis = try RedisServerProcess(tls: certificates.serverArguments(certificate))
            for host in ["127.0.0.1", "localhost"] {
                let endpoint = RedisEndpoint(address: .tcp(host: host, port: redis.port), tls: true)
                let error = failure(endpoint, try certificates.settings())
                #expect(error == nil, "\(certificate) for \(host): \(String(describing: error))")
            }
            let replica = ReplicaModel(port: redis.port, host: "localhost", tls: try certificates.settings())
            waitUntil(#"replica.link == "connected""#) { replica.link == "connected" }
            #expect(replica.commit("ab") == .applied(TokenState(version: 1, token: "ab")))
        }
    }

    @Test func mutualTLSWorksWithAClientCertificateAndIsRefusedWithout() throws {
        let certificates = try TestCertificates()
        let redis = try RedisServerProcess(tls: certificates.serverArguments(clients: true))
        let endpoint = RedisEndpoint(address: .tcp(host: "127.0.0.1", port: redis.port), tls: true)
        #expect(failure(endpoint, try certificates.settings(client: true)) == nil)
        let without = failure(endpoint, try certificates.settings())
        guard case .tlsFailed = without else {
            Issue.record("without a client certificate: \(String(describing: without))")
            return
        }
        let replica = ReplicaModel(port: redis.port, tls: try certificates.settings())
        waitUntil(#"replica.link == "tls_failed""#) { replica.link == "tls_failed" }
        let withCertificate = ReplicaModel(port: redis.port, tls: try certificates.settings(client: true))
        waitUntil(#"withCertificate.link == "connected""#) { withCertificate.link == "connected" }
        #expect(withCertificate.commit("cc") == .applied(TokenState(version: 1, token: "cc")))
    }

    @Test func aPlainRedisBehindRedissAndATLSRedisBehindRedisSayWhy() throws {
        let certificates = try TestCertificates()
        let plain = try RedisServerProcess()
        let error = failure(
            RedisEndpoint(address: .tcp(host: "127.0.0.1", port: plain.port), tls: true), try certificates.settings())
        guard case .tlsFailed = error else {
            Issue.record("plain Redis behind rediss://: \(String(describing: error))")
            return
        }
        let toPlain = ReplicaModel(port: plain.port, tls: try certificates.settings())
        waitUntil(#"toPlain.link == "tls_failed""#) { toPlain.link == "tls_failed" }

        let tls = try RedisServerProcess(tls: certificates.serverArguments())
        let plainToTLS = failure(
            RedisEndpoint(address: .tcp(host: "127.0.0.1", port: tls.port)), try certificates.settings())
        guard case .unreachable(let why) = plainToTLS else {
            Issue.record("TLS Redis behind redis://: \(String(describing: plainToTLS))")
            return
        }
        #expect(why.contains("rediss://"), "\(why)")
        let log = LogRecorder()
        let toTLS = ReplicaModel(port: tls.port, log: log.serverHandler)
        waitUntil(#"toTLS.link == "unreachable" && !log.recorded.isEmpty"#) {
            toTLS.link == "unreachable" && !log.recorded.isEmpty
        }
        #expect(log.recorded.contains { $0.message.contains("use a rediss:// URL") }, "\(log.recorded)")
    }
}

import Dispatch
import ForgePushToken
import ForgePushTokenOwner
import ForgePushTokenTestSupport
import Foundation
import HTTPServing
import ServerSupport
import Testing
import TokenService

@testable import forge_push_token_server

/// `--write-token-file` and `--read-token-file` (issue 28, docs/operations.md "Read and write tokens"), and
/// their reload (`CredentialReloader`) on real files.
@Suite struct TokenFileOptionsTests {
    static let write = "write-token-0123456789"
    static let read = "read-token-0123456789a"

    func parse(
        _ arguments: [String], _ environment: [String: String] = [:], files: [String: String] = [:]
    ) throws(CommandLineOptions.UsageError) -> CommandLineOptions {
        try CommandLineOptions.parse(arguments, environment: environment) { path in
            guard let text = files[path] else {
                throw CommandLineOptions.UsageError(description: "No such file or directory")
            }
            return text
        }
    }

    func usageError(
        _ arguments: [String], _ environment: [String: String] = [:], files: [String: String] = [:]
    ) -> String? {
        do {
            _ = try parse(arguments, environment, files: files)
            return nil
        } catch {
            return error.description
        }
    }

    @Test func writeAndReadFilesMakeTwoRoles() throws {
        let options = try parse(
            ["--write-token-file", "/w", "--read-token-file=/r"],
            files: ["/w": "# writers\r\n\(Self.write)\r\n", "/r": "\(Self.read)\n\n"])
        #expect(options.writeTokenFile == "/w" && options.readTokenFile == "/r")
        let authentication = try #require(options.authentication)
        #expect(authentication.scope == .all)
        #expect(authentication.tokenCount(.write) == 1 && authentication.tokenCount(.read) == 1)
        #expect(options.startupWarnings.isEmpty)
    }

    @Test func environmentVariablesNameTheFiles() throws {
        let options = try parse(
            [],
            [
                "FORGE_PUSH_TOKEN_WRITE_TOKEN_FILE": "/w", "FORGE_PUSH_TOKEN_READ_TOKEN_FILE": "/r",
                "FORGE_PUSH_TOKEN_HOST": "0.0.0.0",
            ],
            files: ["/w": Self.write, "/r": Self.read])
        #expect(options.unknownVariables.isEmpty)
        #expect(options.authentication?.tokenCount(.read) == 1)
        #expect(options.startupWarnings.isEmpty, "a write-token file is a token: no open-service warning")
    }

    @Test func writeFileAloneLeavesReadsOpen() throws {
        let options = try parse(["--write-token-file", "/w"], files: ["/w": Self.write])
        #expect(options.authentication?.scope == .writes)
        #expect(options.readTokens == nil)
    }

    @Test(arguments: [
        (["--read-token-file", "/r"], [String: String](), "--read-token-file needs --write-token-file"),
        ([], ["FORGE_PUSH_TOKEN_READ_TOKEN_FILE": "/r"], "needs --write-token-file"),
        (["--write-token-file", "/w", "--auth-token", Self.write], [:], "excludes --auth-token"),
        (["--write-token-file", "/w", "--auth-token-file", "/w"], [:], "excludes --auth-token-file"),
        (["--write-token-file", "/w", "--auth-scope", "all"], [:], "excludes --auth-scope"),
        (["--read-token-file", "/r"], ["FORGE_PUSH_TOKEN_AUTH_TOKEN": Self.write], "excludes --auth-token"),
        (["--write-token-file", "/missing"], [:], "--write-token-file: cannot read /missing"),
        (["--write-token-file", ""], [:], "--write-token-file needs a path"),
    ])
    func refusedCombinations(arguments: [String], environment: [String: String], expected: String) throws {
        let error = try #require(
            usageError(arguments, environment, files: ["/w": Self.write, "/r": Self.read]))
        #expect(error.contains(expected), "\(error)")
        #expect(!error.contains(Self.write) && !error.contains(Self.read))
    }

    @Test func badFilesNameTheFileTheLineAndTheReasonNeverTheToken() throws {
        let fifteen = String(Self.write.prefix(15))
        let short = try #require(
            usageError(["--write-token-file", "/w"], files: ["/w": "# c\r\n\(Self.write)\r\n\(fifteen)\r\n"]))
        #expect(short.hasPrefix("--write-token-file /w: line 3: the token has 15 characters"), "\(short)")
        #expect(!short.contains(fifteen))
        let many = (0..<65).map { "token-number-\(1000 + $0)" }.joined(separator: "\n")
        let tooMany = try #require(
            usageError(["--write-token-file", "/w", "--read-token-file", "/r"], files: ["/w": Self.write, "/r": many]))
        #expect(tooMany.hasPrefix("--read-token-file /r: line 65: one token more than the 64"), "\(tooMany)")
        #expect(
            usageError(["--write-token-file", "/w"], files: ["/w": "\(Self.write.prefix(16))"]) == nil,
            "16 characters is a token")
        let fromVariable = try #require(
            usageError([], ["FORGE_PUSH_TOKEN_WRITE_TOKEN_FILE": "/w"], files: ["/w": "\n# none\n"]))
        #expect(
            fromVariable.contains("no token") && fromVariable.hasSuffix("(set by FORGE_PUSH_TOKEN_WRITE_TOKEN_FILE)"))
    }

    @Test func aDirectoryIsNotATokenFile() throws {
        let folder = try TemporaryFolder()
        do {
            _ = try CommandLineOptions.parse(["--write-token-file", folder.path], environment: [:])
            Issue.record("a directory was read as a token file")
        } catch {
            #expect(error.description.contains("not a regular file"), "\(error)")
        }
    }

    /// A reloader over real files, its responder and the log lines it wrote.
    struct Reloading {
        let folder: TemporaryFolder
        let responder: Responder
        let reloader: CredentialReloader
        let lines: Locked<[String]>

        var writePath: String { folder.path + "/write" }
        var readPath: String { folder.path + "/read" }

        init() throws {
            folder = try TemporaryFolder()
            try folder.write("write", TokenFileOptionsTests.write + "\n")
            try folder.write("read", TokenFileOptionsTests.read + "\n")
            let options = try CommandLineOptions.parse(
                ["--write-token-file", folder.path + "/write", "--read-token-file", folder.path + "/read"],
                environment: [:])
            responder = Responder(
                owner: TokenOwner(store: MemoryTokenStore(), initial: .initial, maxSubscribers: 8),
                authentication: options.authentication)
            let lines = Locked<[String]>([])
            self.lines = lines
            reloader = CredentialReloader(
                writePath: folder.path + "/write", readPath: folder.path + "/read", responder: responder,
                log: ServerLog(minimumLevel: .info) { line in lines.withLock { $0.append(line) } })
        }

        /// Reloads now and waits for that reload's log line (the reloader's queue is serial); the
        /// line, or "" if it never came (the wait has failed the test).
        func reload(sourceLocation: SourceLocation = #_sourceLocation) -> String {
            let before = lines.withLock { $0.count }
            reloader.reload(because: "test")
            guard
                waitUntil(
                    "the reload's log line", sourceLocation: sourceLocation, { lines.withLock { $0.count } > before })
            else { return "" }
            return lines.withLock { $0[before] }
        }

        func counts() -> (read: Int, write: Int)? {
            responder.access.current.map { ($0.tokenCount(.read), $0.tokenCount(.write)) }
        }

        func metric(_ result: String) -> Bool {
            let text = responder.metrics.render(subscribers: 0, events: DeliveryCounts(sent: 0, skipped: 0))
            return text.contains("forge_push_token_credentials_reloads_total{result=\"\(result)\"} 1\n")
        }
    }

    @Test func aReloadPutsTheNewFilesInForce() throws {
        let setup = try Reloading()
        try setup.folder.write("write", "\(Self.write)\nsecond-write-token-000\n")
        let line = setup.reload()
        #expect(line.contains("credentials reloaded (test): 2 write and 1 read tokens"), "\(line)")
        #expect(setup.counts()! == (1, 2))
        // The reload is logged before it is counted: wait for the count.
        waitUntil(#"setup.metric("ok")"#) { setup.metric("ok") }
    }

    @Test func aLinkSwapIsNoticedWithoutASignal() throws {
        // A Kubernetes Secret volume: write -> ..data/write, ..data -> one folder, then another.
        let setup = try Reloading()
        let volume = setup.folder.path
        for name in ["a", "b"] {
            #expect(mkdir(volume + "/..folder-" + name, 0o700) == 0)
        }
        try setup.folder.write("..folder-a/write", Self.write + "\n")
        try setup.folder.write("..folder-b/write", "second-write-token-000\n")
        #expect(symlink("..folder-a", volume + "/..data") == 0)
        #expect(unlink(setup.writePath) == 0 && symlink("..data/write", setup.writePath) == 0)
        let first = setup.reload()
        #expect(first.contains("1 write and 1 read tokens"), "\(first)")
        setup.reloader.start()
        defer { setup.reloader.stop() }
        let before = setup.lines.withLock { $0.count }
        #expect(symlink("..folder-b", volume + "/..data-next") == 0)
        #expect(rename(volume + "/..data-next", volume + "/..data") == 0)
        // The poll looks every second: wait for its line, not for a deadline.
        guard waitUntil("the poll's reload line", { setup.lines.withLock { $0.count } > before }) else { return }
        let line = setup.lines.withLock { $0[before] }
        #expect(line.contains("credentials reloaded (a token file changed)"), "\(line)")
        let check = setup.responder.access.current?.check(
            authorization: "Bearer second-write-token-000", query: nil, method: "POST")
        #expect(check?.isAuthorized == true)
    }

    @Test func aChangeAfterTheStartReadIsReloadedByTheFirstPoll() throws {
        let folder = try TemporaryFolder()
        try folder.write("write", Self.write + "\n")
        let options = try CommandLineOptions.parse(["--write-token-file", folder.path + "/write"], environment: [:])
        #expect(options.tokenFileSignatures.count == 1)
        // The file changes after it was read at start, before the reloader exists.
        try folder.write("write", "second-write-token-000\n")
        let responder = Responder(
            owner: TokenOwner(store: MemoryTokenStore(), initial: .initial, maxSubscribers: 2),
            authentication: options.authentication)
        let lines = Locked<[String]>([])
        let reloader = CredentialReloader(
            writePath: folder.path + "/write", readPath: nil, responder: responder,
            log: ServerLog(minimumLevel: .info) { line in lines.withLock { $0.append(line) } },
            signatures: options.tokenFileSignatures)
        reloader.start()
        defer { reloader.stop() }
        guard waitUntil("the first poll's reload line", { !lines.withLock { $0.isEmpty } }) else { return }
        #expect(lines.withLock { $0[0] }.contains("credentials reloaded (a token file changed)"))
        let check = responder.access.current?.check(
            authorization: "Bearer second-write-token-000", query: nil, method: "POST")
        #expect(check?.isAuthorized == true)
    }

    @Test func aVanishedFileIsAFailedReloadThatKeepsTheTokens() throws {
        let setup = try Reloading()
        #expect(unlink(setup.writePath) == 0)
        let line = setup.reload()
        #expect(line.contains(" error "), "\(line)")
        #expect(line.contains("--write-token-file: cannot read \(setup.writePath): No such file"), "\(line)")
        #expect(setup.counts()! == (1, 1))
        waitUntil(#"setup.metric("failed")"#) { setup.metric("failed") }
    }

    @Test func aFileReplacedByADirectoryOrMadeInvalidIsAFailedReload() throws {
        let setup = try Reloading()
        #expect(unlink(setup.readPath) == 0 && mkdir(setup.readPath, 0o700) == 0)
        let directory = setup.reload()
        #expect(directory.contains("--read-token-file: cannot read \(setup.readPath): not a regular file"))
        #expect(rmdir(setup.readPath) == 0)
        try setup.folder.write("read", "\(Self.read)\nshort\n")
        let invalid = setup.reload()
        #expect(invalid.contains("--read-token-file \(setup.readPath): line 2: the token has 5 characters"))
        #expect(!invalid.contains(Self.read) && !invalid.contains("short"))
        #expect(setup.counts()! == (1, 1))
    }
}

/// A fresh folder under the temporary directory, removed with its files when released.
final class TemporaryFolder: Sendable {
    let path: String

    init() throws {
        var template = Array((NSTemporaryDirectory() + "/forge-token-files-XXXXXX").utf8CString)
        guard let made = mkdtemp(&template) else { throw CocoaError(.fileWriteUnknown) }
        path = String(cString: made)
    }

    /// Writes `text` to `name` in the folder (replacing it through a rename, as editors do).
    func write(_ name: String, _ text: String) throws {
        try Data(text.utf8).write(to: URL(fileURLWithPath: path + "/" + name), options: .atomic)
    }

    deinit {
        try? FileManager.default.removeItem(atPath: path)
    }
}

import ForgePushToken
import ForgePushTokenOwnerTestSupport
import ForgePushTokenTestSupport
import ServerSupport
import Testing

@testable import ForgePushTokenOwner

#if canImport(Glibc)
    import Glibc
#endif

/// The state file: durable writes, strict reads.
@Suite struct StateFileTests {
    /// A fresh folder under /tmp, removed by the caller.
    func folder() -> String {
        var template = Array("/tmp/fpt-state-XXXXXX".utf8CString)
        return template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)) }
    }

    func write(_ text: String, to path: String) {
        let file = fopen(path, "w")!
        fputs(text, file)
        fclose(file)
    }

    @Test func missingFileIsAFirstStart() throws {
        let dir = folder()
        defer { rmdir(dir) }
        #expect(try StateFile(path: dir + "/state.json").load() == nil)
    }

    @Test func saveThenLoadRoundTrips() throws {
        let dir = folder()
        let file = StateFile(path: dir + "/state.json")
        defer {
            unlink(file.path)
            rmdir(dir)
        }
        try file.save(.init(token: "a1b2", version: 7))
        #expect(try file.load() == .init(token: "a1b2", version: 7))
        try file.save(.init(token: nil, version: 8))
        #expect(try file.load() == .init(token: nil, version: 8))
        #expect(access(file.path + ".tmp", F_OK) != 0, "the temporary file is renamed away")
    }

    @Test(
        "a save writes the file at its path, whatever the path's shape (a bare name lost its first letter)",
        arguments: [
            ("state.json", ".", "state.json"), ("./state.json", ".", "state.json"), ("/state.json", "/", "state.json"),
            ("/var/lib/forge/state.json", "/var/lib/forge", "state.json"), ("data/s", "data", "s"),
            ("a//b", "a/", "b"),
            // A `/` that one `Character` holds with a mark beside it is still where the path splits.
            ("dir\u{600}/x", "dir\u{600}", "x"), ("a/\u{301}b", "a", "\u{301}b"), ("é/é.json", "é", "é.json"),
        ])
    func pathShapes(path: String, folder: String, name: String) {
        let file = StateFile(path: path)
        #expect(file.folder == folder)
        #expect(file.name == name)
        #expect(file.temporaryName == name + ".tmp")
        #expect(file.temporary == path + ".tmp")
    }

    @Test("a relative path is saved to and loaded from that path, in a folder of its own")
    func relativePathRoundTrips() throws {
        let dir = folder()
        var cwd = [CChar](repeating: 0, count: 4096)
        let here = String(cString: getcwd(&cwd, cwd.count)!)
        // The same folder, reached from the working directory through "..": a relative path
        // with a folder part, without changing the process's working directory.
        let relative = String(repeating: "../", count: here.split(separator: "/").count) + String(dir.dropFirst())
        let file = StateFile(path: relative + "/state.json")
        defer {
            unlink(dir + "/state.json")
            rmdir(dir)
        }
        try file.save(.init(token: "c3d4", version: 2))
        #expect(try StateFile(path: dir + "/state.json").load() == .init(token: "c3d4", version: 2))
        #expect(try file.load() == .init(token: "c3d4", version: 2))
    }

    @Test("the file's bytes are JSONEncoder's with sorted keys, written directly for hex tokens and none")
    func contentsBytes() throws {
        var generator = SeededGenerator(state: 32)
        var samples: [StateFile.Contents] = [
            .init(token: nil, version: 0), .init(token: nil, version: .max), .init(token: "", version: 1),
            .init(token: "00", version: 10), .init(token: String(repeating: "f", count: 512), version: 12_345),
            // Not hex: through JSONEncoder, escapes and all.
            .init(token: "AB", version: 3), .init(token: "a\"b\\c\u{2028}\n", version: 4),
            // Printable ASCII that is not lowercase hex, each needing an escape or not.
            .init(token: "a\"b", version: 5), .init(token: "a\\b", version: 6), .init(token: "\"", version: 7),
            .init(token: "a/b", version: 8), .init(token: "g", version: 9), .init(token: "\u{1F}", version: 10),
            // With the highest version tried (issue 42), hex and not.
            .init(token: "ab", version: 3, tried: 9), .init(token: nil, version: 0, tried: .max),
            .init(token: "A", version: 1, tried: 2),
        ]
        for _ in 0..<200 {
            let bytes = (0..<Int.random(in: 1...64, using: &generator)).map { _ in
                UInt8.random(in: 0...255, using: &generator)
            }
            samples.append(
                .init(
                    token: DeviceTokenHex.encode(bytes), version: UInt64.random(in: 0...UInt64.max, using: &generator)))
        }
        for contents in samples {
            #expect(contents.bytes == JSONBody.encode(contents) + [0x0A], "\(contents)")
        }
    }

    @Test(arguments: [
        "", "{", "[]", #"{"version":1}"#, #"{"token":"a1","version":-1}"#, #"{"token":"A1","version":1}"#,
        #"{"token":"abc","version":1}"#, #"{"token":7,"version":1}"#, "garbage",
        // `tried` is above `version`, a whole number (issue 42).
        #"{"token":"a1","tried":1,"version":1}"#, #"{"token":"a1","tried":0,"version":1}"#,
        #"{"token":"a1","tried":-2,"version":1}"#, #"{"token":"a1","tried":"2","version":1}"#,
    ])
    func unparsableFileIsAnErrorNamingTheFile(text: String) throws {
        let dir = folder()
        let path = dir + "/state.json"
        defer {
            unlink(path)
            rmdir(dir)
        }
        write(text, to: path)
        #expect {
            try StateFile(path: path).load()
        } throws: { error in
            (error as? StateFile.Failure)?.description.contains(path) == true
        }
    }

    @Test("a version next to 2^64 - 1 loads, and changes after it neither trap nor write what the next start refuses")
    func versionsSaturate() throws {
        let dir = folder()
        let file = StateFile(path: dir + "/state.json")
        defer {
            unlink(file.path)
            rmdir(dir)
        }
        write(#"{"token":"abcd","version":18446744073709551614}"#, to: file.path)
        let store = StateFileStore(file: file)
        let owner = TokenOwner<TokenState>(store: store, initial: try store.load(), maxSubscribers: 1)
        #expect(owner.health == .ok)
        #expect(commitAndWait(owner, "01") == .applied(TokenState(version: .max, token: "01")))
        // Every change is refused from now on: health says so (attack finding, issue 21 §6).
        #expect(owner.health == .degraded(reason: HealthReason.versionExhausted))
        // No higher version is left: a change is refused (never acknowledged and then not served,
        // never a second value under the same id), and nothing is written.
        #expect(commitAndWait(owner, "02") == .versionExhausted)
        #expect(owner.current == TokenState(version: .max, token: "01"))
        #expect(commitAndWait(owner, "01") == .unchanged(TokenState(version: .max, token: "01")))
        #expect(try file.load() == .init(token: "01", version: .max))
        let again = try StateFileStore(file: file).load()
        #expect(again == TokenState(version: .max, token: "01"))
        // A file already at 2^64 - 1 starts degraded, not ok.
        let restarted = TokenOwner<TokenState>(store: StateFileStore(file: file), initial: again, maxSubscribers: 1)
        #expect(restarted.health == .degraded(reason: HealthReason.versionExhausted))
    }

    @Test("a symbolic link at the temporary name is replaced, never written through (attack regression)")
    func temporaryNameIsNeverFollowed() throws {
        let dir = folder()
        let file = StateFile(path: dir + "/state.json")
        let victim = dir + "/victim"
        defer {
            unlink(file.path)
            unlink(victim)
            unlink(file.path + ".tmp")
            rmdir(dir)
        }
        write("precious\n", to: victim)
        symlink(victim, file.path + ".tmp")
        try file.save(.init(token: "abcd", version: 1))
        let handle = fopen(victim, "r")!
        var buffer = [CChar](repeating: 0, count: 64)
        fgets(&buffer, 64, handle)
        fclose(handle)
        let text = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        #expect(text == "precious\n")
        var info = stat()
        #expect(lstat(file.path, &info) == 0 && (info.st_mode & S_IFMT) == S_IFREG)
        #expect(try file.load() == .init(token: "abcd", version: 1))
    }

    @Test("a FIFO (or any file that is not a regular one) is refused at once, never waited on")
    func notARegularFileIsRefused() throws {
        let dir = folder()
        let path = dir + "/state.json"
        defer {
            unlink(path)
            rmdir(dir)
        }
        #expect(mkfifo(path, 0o600) == 0)
        #expect {
            try StateFile(path: path).load()
        } throws: { error in
            (error as? StateFile.Failure)?.description.contains("not a regular file") == true
        }
        #expect {
            try StateFile(path: dir).load()
        } throws: { error in
            (error as? StateFile.Failure)?.description.contains("not a regular file") == true
        }
    }

    @Test func unwritableFolderIsAnError() {
        #expect(throws: StateFile.Failure.self) {
            try StateFile(path: "/nonexistent-folder/state.json").save(.init(token: nil, version: 1))
        }
    }
}

/// `SmallFile.contents`: whole files of any size up to the limit, whatever its buffer's size.
@Suite struct SmallFileTests {
    @Test(arguments: [0, 1, 80, 4_095, 4_096, 16_383, 16_384, 16_385, 40_000])
    func readsAFileWhole(size: Int) throws {
        var template = Array("/tmp/fpt-small-XXXXXX".utf8CString)
        let (fd, path) = template.withUnsafeMutableBufferPointer {
            (mkstemp($0.baseAddress!), String(cString: $0.baseAddress!))
        }
        defer { unlink(path) }
        let bytes = (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) }
        #expect(bytes.withUnsafeBytes { write(fd, $0.baseAddress, size) } == size)
        close(fd)
        #expect(try SmallFile.contents(of: path, maxBytes: 64 * 1024) == bytes)
        #expect(try SmallFile.contents(of: path, maxBytes: size) == bytes)
        if size > 0 {
            #expect(throws: SmallFile.ReadError.tooLarge) { try SmallFile.contents(of: path, maxBytes: size - 1) }
        }
    }

    @Test func readsAProcFileWhoseSizeIsZero() throws {
        // /proc/self/stat reports a size of 0 and holds one line ending in LF.
        let stat = try SmallFile.contents(of: "/proc/self/stat", maxBytes: 4096)
        #expect(stat.count > 20 && stat.last == UInt8(ascii: "\n"))
        // /proc/self/maps of a Swift process is longer than one buffer.
        let maps = try SmallFile.contents(of: "/proc/self/maps", maxBytes: 1 << 20)
        #expect(maps.count > 16_384 && maps.last == UInt8(ascii: "\n"))
    }
}

import Testing
#if canImport(Glibc)
import Glibc
#endif
@testable import ForgePushTokenHTTP

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
        defer { unlink(file.path); rmdir(dir) }
        try file.save(.init(token: "a1b2", version: 7))
        #expect(try file.load() == .init(token: "a1b2", version: 7))
        try file.save(.init(token: nil, version: 8))
        #expect(try file.load() == .init(token: nil, version: 8))
        #expect(access(file.path + ".tmp", F_OK) != 0, "the temporary file is renamed away")
    }

    @Test(arguments: ["", "{", "[]", #"{"version":1}"#, #"{"token":"a1","version":-1}"#, #"{"token":"A1","version":1}"#,
                      #"{"token":"abc","version":1}"#, #"{"token":7,"version":1}"#, "garbage"])
    func unparsableFileIsAnErrorNamingTheFile(text: String) throws {
        let dir = folder()
        let path = dir + "/state.json"
        defer { unlink(path); rmdir(dir) }
        write(text, to: path)
        #expect {
            try StateFile(path: path).load()
        } throws: { error in
            (error as? StateFile.Failure)?.description.contains(path) == true
        }
    }

    @Test func unwritableFolderIsAnError() {
        #expect(throws: StateFile.Failure.self) {
            try StateFile(path: "/nonexistent-folder/state.json").save(.init(token: nil, version: 1))
        }
    }
}

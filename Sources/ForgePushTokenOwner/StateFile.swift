import ForgePushToken
import ServerSupport

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif
#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// The file that keeps the token and its version across restarts (`--state-file`).
///
/// Format: one JSON object, `{"token":"<lowercase hex>"|null,"version":<whole number>}`, with a
/// third key, `"tried":<whole number>`, when a write that failed tried a version above `version`
/// (`StateFileStore`): the next change takes a version above it, so that no version names two
/// tokens across a restart.
///
/// A write is durable before it returns: the JSON goes to a temporary file beside the target, which
/// is flushed with `fsync(2)`, renamed over the target (atomic on POSIX file systems), and then the
/// folder is flushed too, so that the rename itself survives a crash. A reader therefore always
/// finds either the previous complete state or the new one, never a mix.
///
/// Thread-safety: `Sendable`; callers serialise writes (`StateFileStore` commits one at a time).
public struct StateFile: Sendable {
    /// The file's path.
    public let path: String

    /// What the file holds.
    public struct Contents: Sendable, Equatable, Codable {
        /// The token as lowercase hex digits, or `nil`.
        public var token: String?
        /// The token's version (0 for the first state, one more per change; a change after a
        /// failed write takes one more than `tried`).
        public var version: UInt64
        /// The highest version a write has tried, when above `version` (a write that failed, and
        /// may or may not have reached the disk, tried it); `nil` otherwise. The next change takes
        /// a version above it.
        public var tried: UInt64?

        /// Creates contents; `tried`, when given, is above `version`.
        public init(token: String?, version: UInt64, tried: UInt64? = nil) {
            self.token = token
            self.version = version
            self.tried = tried
        }

        /// The highest version any write has tried: `tried`, or `version` without it.
        public var highestTried: UInt64 { max(version, tried ?? version) }

        /// Decodes the object; `token` must be present (as a string or `null`), and `tried`, when
        /// present, above `version`.
        public init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            guard container.contains(.token) else {
                throw DecodingError.keyNotFound(CodingKeys.token, .init(codingPath: [], debugDescription: "no token"))
            }
            token = try container.decode(String?.self, forKey: .token)
            version = try container.decode(UInt64.self, forKey: .version)
            tried = try container.decodeIfPresent(UInt64.self, forKey: .tried)
            if let tried, tried <= version {
                throw DecodingError.dataCorruptedError(
                    forKey: .tried, in: container, debugDescription: "tried is not above version")
            }
        }

        /// Encodes `token` (as `null` when there is none), `version`, and `tried` when there is one.
        public func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            try container.encode(token, forKey: .token)
            try container.encode(version, forKey: .version)
            try container.encodeIfPresent(tried, forKey: .tried)
        }

        enum CodingKeys: String, CodingKey { case token, tried, version }

        /// What the file holds for these contents: the JSON object and a newline. For the tokens
        /// the service stores (lowercase hex, or none) written directly, as the same bytes
        /// `JSONBody.encode` makes (sorted keys, so `token` first; nothing in hex to escape):
        /// `JSONEncoder` cost 25,000 instructions a save, on the path every write waits for
        /// (docs/performance.md, "What the hot paths avoid"). Any other token goes through it.
        var bytes: [UInt8] {
            let hex = token?.utf8.allSatisfy(DeviceTokenHex.isLowercaseDigit) ?? true
            guard hex else { return JSONBody.encode(self) + [0x0A] }
            var out: [UInt8] = []
            out.reserveCapacity(40 + (token?.utf8.count ?? 0))
            out.append(contentsOf: #"{"token":"#.utf8)
            if let token {
                out.append(UInt8(ascii: "\""))
                out.append(contentsOf: token.utf8)
                out.append(UInt8(ascii: "\""))
            } else {
                out.append(contentsOf: "null".utf8)
            }
            if let tried {
                out.append(contentsOf: #","tried":"#.utf8)
                out.append(contentsOf: String(tried).utf8)
            }
            out.append(contentsOf: #","version":"#.utf8)
            out.append(contentsOf: String(version).utf8)
            out.append(contentsOf: "}\n".utf8)
            return out
        }
    }

    /// Why the state file could not be read or written; `description` is one line naming the file.
    public struct Failure: Error, Sendable, Equatable, CustomStringConvertible {
        /// One line naming the file and the cause.
        public let description: String
    }

    /// A state file at `path` (it need not exist yet).
    public init(path: String) {
        self.path = path
        // The last `/` byte: the kernel splits a path at bytes, where `Character`s could hold a
        // `/` together with a neighbouring combining or prepended mark and hide it.
        let bytes = path.utf8
        let slash = bytes.lastIndex(of: UInt8(ascii: "/"))
        let name = String(Substring(slash.map { bytes[bytes.index(after: $0)...] } ?? bytes[...]))
        self.name = name
        self.temporaryName = name + ".tmp"
        self.folder = slash.map { slash in slash == bytes.startIndex ? "/" : String(Substring(bytes[..<slash])) } ?? "."
    }

    /// Reads the file.
    /// - Returns: its contents, or `nil` when the file does not exist (a first start).
    /// - Throws: `Failure` when it exists but cannot be read, is not the JSON above, or holds a token
    ///   that is not 2 to 512 lowercase hex digits: nothing is silently discarded.
    public func load() throws(Failure) -> Contents? {
        let bytes: [UInt8]
        do {
            bytes = try SmallFile.contents(of: path, maxBytes: 64 * 1024)
        } catch .system(ENOENT) {
            return nil
        } catch .tooLarge {
            throw Failure(description: "state file \(path) is over 64 KiB: not a state file")
        } catch {
            throw Failure(description: "cannot read state file \(path): \(error.text)")
        }
        let contents: Contents
        do {
            contents = try JSONDecoder().decode(Contents.self, from: Data(bytes))
        } catch {
            throw Failure(
                description:
                    #"state file \#(path) cannot be parsed: expected {"token":"<hex>"|null,"version":N} (and "tried":M > N)"#
            )
        }
        if let token = contents.token {
            // Canonical: what the service itself writes, 1 to 256 bytes as lowercase hex.
            let valid =
                token.utf8.count <= 2 * TokenState.maxTokenBytes
                && DeviceTokenHex.decode(token).map(DeviceTokenHex.encode) == token
            guard valid else { throw Failure(description: "state file \(path) holds an invalid token") }
        }
        return contents
    }

    /// Writes `contents` durably (temporary file, fsync, rename, fsync of the folder).
    /// - Throws: `Failure` naming the step that failed; the previous file is then unchanged, except
    ///   when only the folder's `fsync` failed (the new file is then in place but maybe not durable).
    public func save(_ contents: Contents) throws(Failure) {
        let replacement = try replace(with: contents)
        defer { replacement.close() }
        try flushFolder(of: replacement)
    }

    /// The first stage of a save, done: the new contents are in a file of their own, flushed with
    /// `fsync(2)`, and renamed over the target. The rename is not durable until the folder is
    /// flushed (`flushFolder(of:)`); only then may anyone be told the contents are saved.
    ///
    /// It keeps two descriptors open, released with `close()` (exactly once):
    /// - the folder, opened before the temporary file was made in it, so that the folder flushed is
    ///   the one the rename happened in, whatever happens to the path meanwhile;
    /// - the new file itself. While it is open, the rename that replaces it later only unlinks it,
    ///   and the file system frees its blocks (on a disk mounted with `discard`, a synchronous
    ///   discard request) at `close()`, which a caller can do after answering rather than in the
    ///   middle of the next save.
    ///
    /// Thread-safety: a value; `close()` once, from any thread.
    package struct Replacement: Sendable {
        /// The new file, now at the target path.
        let file: Int32
        /// The folder it was renamed in.
        let folder: Int32

        /// Closes both descriptors.
        package func close() {
            closeDescriptor(file)
            closeDescriptor(folder)
        }
    }

    /// The first stage of `save(_:)`: writes `contents` to a temporary file beside the target
    /// (made afresh, `O_EXCL`, never through a link), flushes it (`fsync`) and renames it over the
    /// target, all in the folder opened first.
    /// - Returns: the `Replacement`, to flush the folder of and then close.
    /// - Throws: `Failure` naming the step that failed; the target is then unchanged, and the
    ///   temporary file removed.
    package func replace(with contents: Contents) throws(Failure) -> Replacement {
        let bytes = contents.bytes
        let directory = open(folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard directory >= 0 else { throw failure("open the folder of", path) }
        let temporaryName = temporaryName
        // Made afresh (O_EXCL), never through a link: whatever is at the temporary name (a
        // leftover, or a symbolic link planted to make the service overwrite another file) is
        // removed first.
        unlinkat(directory, temporaryName, 0)
        let fd = openat(directory, temporaryName, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            let error = failure("create", temporary)
            closeDescriptor(directory)
            throw error
        }
        func abandon(_ step: String) -> Failure {
            let error = failure(step, temporary)
            closeDescriptor(fd)
            unlinkat(directory, temporaryName, 0)
            closeDescriptor(directory)
            return error
        }
        guard bytes.withUnsafeBytes({ writeAll($0, to: fd) }) else { throw abandon("write") }
        guard fsync(fd) == 0 else { throw abandon("fsync") }
        guard renameat(directory, temporaryName, directory, name) == 0 else { throw abandon("rename") }
        return Replacement(file: fd, folder: directory)
    }

    /// The temporary file's path: the target's, with `.tmp` added.
    var temporary: String { path + ".tmp" }

    /// The temporary file's name in the folder.
    let temporaryName: String

    /// The target's name in the folder: what follows the path's last `/`, or the whole path when
    /// it has none (a name in the working directory).
    let name: String

    /// The second stage of `save(_:)`: flushes the folder `replacement` was renamed in (`fsync`),
    /// which makes the rename, and so the new contents, durable. One flush covers every rename
    /// made in that folder before it began.
    /// - Throws: `Failure` when the `fsync` fails: the new file is in place, but maybe not durable.
    package func flushFolder(of replacement: Replacement) throws(Failure) {
        guard fsync(replacement.folder) == 0 else { throw failure("fsync the folder of", path) }
    }

    /// The folder that holds the file (and its temporary twin): `.` for a bare name, `/` for a
    /// file at the root.
    public let folder: String

    private func failure(_ step: String, _ file: String) -> Failure {
        Failure(description: "cannot \(step) state file \(file): \(systemErrorText(errno))")
    }
}

/// `close(2)`, for code where a member named `close` hides the C function.
private func closeDescriptor(_ descriptor: Int32) {
    _ = close(descriptor)
}

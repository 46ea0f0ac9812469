import ForgePushToken

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
/// Format: one JSON object, `{"token":"<lowercase hex>"|null,"version":<whole number>}`.
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
        /// The token's version (0 for the first state, +1 per change).
        public var version: UInt64

        /// Creates contents.
        public init(token: String?, version: UInt64) {
            self.token = token
            self.version = version
        }

        /// Decodes the object; `token` must be present (as a string or `null`).
        public init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            guard container.contains(.token) else {
                throw DecodingError.keyNotFound(CodingKeys.token, .init(codingPath: [], debugDescription: "no token"))
            }
            token = try container.decode(String?.self, forKey: .token)
            version = try container.decode(UInt64.self, forKey: .version)
        }

        /// Encodes both keys, `token` as `null` when there is none.
        public func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            try container.encode(token, forKey: .token)
            try container.encode(version, forKey: .version)
        }

        enum CodingKeys: String, CodingKey { case token, version }
    }

    /// Why the state file could not be read or written; `description` is one line naming the file.
    public struct Failure: Error, Sendable, Equatable, CustomStringConvertible {
        /// One line naming the file and the cause.
        public let description: String
    }

    /// A state file at `path` (it need not exist yet).
    public init(path: String) {
        self.path = path
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
                description: #"state file \#(path) cannot be parsed: expected {"token":"<hex>"|null,"version":N}"#)
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
    /// - Throws: `Failure` naming the step that failed; the previous file is then unchanged.
    public func save(_ contents: Contents) throws(Failure) {
        let bytes = JSONBody.encode(contents) + [0x0A]
        let temporary = path + ".tmp"
        // Made afresh (O_EXCL), never through a link: whatever is at the temporary name (a
        // leftover, or a symbolic link planted to make the service overwrite another file) is
        // removed first.
        unlink(temporary)
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw failure("create", temporary) }
        var offset = 0
        while offset < bytes.count {
            let written = bytes[offset...].withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
            if written < 0 {
                if errno == EINTR { continue }
                let error = failure("write", temporary)
                close(fd)
                unlink(temporary)
                throw error
            }
            offset += written
        }
        if fsync(fd) != 0 {
            let error = failure("fsync", temporary)
            close(fd)
            unlink(temporary)
            throw error
        }
        close(fd)
        guard rename(temporary, path) == 0 else {
            let error = failure("rename", temporary)
            unlink(temporary)
            throw error
        }
        let directory = open(folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard directory >= 0 else { throw failure("open the folder of", path) }
        defer { close(directory) }
        guard fsync(directory) == 0 else { throw failure("fsync the folder of", path) }
    }

    /// The folder that holds the file (and its temporary twin): `.` for a bare name, `/` for a
    /// file at the root.
    public var folder: String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        let folder = String(path[..<slash])
        return folder.isEmpty ? "/" : folder
    }

    private func failure(_ step: String, _ file: String) -> Failure {
        Failure(description: "cannot \(step) state file \(file): \(systemErrorText(errno))")
    }
}

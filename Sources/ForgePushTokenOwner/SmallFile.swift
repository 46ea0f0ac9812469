#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Reads a small file whole with POSIX calls (`open`, `read` until the end, retrying `EINTR`),
/// for the service's own files: the state file, a token file, TLS certificates.
///
/// Thread-safety: stateless; safe from any thread.
package enum SmallFile {
    /// Why a file could not be read.
    package enum ReadError: Error, Equatable {
        /// A system call failed with this `errno` (`ENOENT` for a missing file).
        case system(Int32)
        /// The file is longer than the limit given.
        case tooLarge

        /// The C library's text for `.system` (`strerror(3)`), or "over the size limit".
        package var text: String {
            switch self {
            case .system(let code): systemErrorText(code)
            case .tooLarge: "over the size limit"
            }
        }
    }

    /// The bytes of the file at `path`, at most `maxBytes` of them.
    /// - Throws: `ReadError.system` when opening or reading fails, `.tooLarge` past `maxBytes`.
    package static func contents(of path: String, maxBytes: Int) throws(ReadError) -> [UInt8] {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw .system(errno) }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 16_384)
        while true {
            let count = read(fd, &buffer, buffer.count)
            if count < 0 {
                if errno == EINTR { continue }
                throw .system(errno)
            }
            if count == 0 { return bytes }
            bytes += buffer.prefix(count)
            guard bytes.count <= maxBytes else { throw .tooLarge }
        }
    }
}

/// The C library's text for the `errno` value `code` (`strerror(3)`), as every message of the
/// service that names a failed system call gives it.
package func systemErrorText(_ code: Int32) -> String {
    String(cString: strerror(code))
}

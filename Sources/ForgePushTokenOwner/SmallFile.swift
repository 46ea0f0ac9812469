import ForgePushToken
import ServerSupport

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
        /// The path names something other than a regular file (a FIFO, a device, a folder), which
        /// could block the reader forever or never end.
        case notARegularFile

        /// The C library's text for `.system` (`strerror(3)`), or "over the size limit".
        package var text: String {
            switch self {
            case .system(let code): systemErrorText(code)
            case .tooLarge: "over the size limit"
            case .notARegularFile: "not a regular file"
            }
        }
    }

    /// The bytes of the file at `path`, at most `maxBytes` of them.
    /// - Throws: `ReadError.system` when opening or reading fails, `.notARegularFile` for a FIFO,
    ///   device or folder, `.tooLarge` past `maxBytes`.
    package static func contents(of path: String, maxBytes: Int) throws(ReadError) -> [UInt8] {
        // O_NONBLOCK: opening a FIFO must not wait for a writer (it has no effect on a regular file).
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)
        guard fd >= 0 else { throw .system(errno) }
        defer { close(fd) }
        var status = stat()
        guard fstat(fd, &status) == 0 else { throw .system(errno) }
        guard (status.st_mode & S_IFMT) == S_IFREG else { throw .notARegularFile }
        var bytes: [UInt8] = []
        // One byte more than the file's size, so that the first read takes it whole and the
        // second sees its end; no more than the limit allows, nor 16 KiB. (`/proc` files report
        // a size of 0: they get the cap.) A 16 KiB buffer zeroed for a state file of some eighty
        // bytes was a third of reading it (issue 32 §4, the request fuzzer's profile).
        let cap = min(16_384, maxBytes + 1)
        let size = status.st_size > 0 ? min(Int(clamping: status.st_size) + 1, cap) : cap
        var buffer = [UInt8](repeating: 0, count: max(size, 1))
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

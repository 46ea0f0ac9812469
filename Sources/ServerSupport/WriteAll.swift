#if canImport(Darwin)
    import Darwin
#elseif canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// Writes all of `bytes` to `descriptor` (`write(2)`, again after a partial write or `EINTR`).
/// Here, in the lowest module, so that the service's log (standard error) and the state file
/// share one definition; `package`: no app sees it.
/// - Returns: `true` when every byte was written; `false` on the first other failure (`errno`
///   tells why), or a write of nothing (`errno` is then `EIO`).
/// - Thread-safety: any thread; the caller owns `descriptor`.
package func writeAll(_ bytes: UnsafeRawBufferPointer, to descriptor: Int32) -> Bool {
    var offset = 0
    while offset < bytes.count {
        let written = write(descriptor, bytes.baseAddress! + offset, bytes.count - offset)
        if written < 0 && errno == EINTR { continue }
        guard written > 0 else {
            if written == 0 { errno = EIO }
            return false
        }
        offset += written
    }
    return true
}

#if canImport(Darwin)
    import Darwin
#elseif canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// The C library's text for the `errno` value `code` (`strerror(3)`), as every message of the
/// service that names a failed system call gives it. Here, in the lowest module, so that the
/// owner's files and the engine (which does not import the owner) share one definition; `package`:
/// no app sees it.
package func systemErrorText(_ code: Int32) -> String {
    String(cString: strerror(code))
}

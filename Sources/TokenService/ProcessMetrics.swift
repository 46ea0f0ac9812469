import ForgePushTokenOwner
import HTTPServing
import ServerSupport

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// The standard process metrics that every Prometheus client library exports, with their names
/// and meaning (Prometheus documentation, "Writing client libraries", "Process metrics"; the Go
/// client's `process_collector` reads the same `/proc` files): CPU time, resident and virtual
/// memory, open and maximum file descriptors, start time.
///
/// Read from Linux's `/proc` (proc(5)): `/proc/self/stat` for CPU time, memory and the start
/// time (in clock ticks since boot, made absolute with `btime` of `/proc/stat`), `/proc/self/fd`
/// for the open descriptors (its size on Linux 6.2 and later, its entries before),
/// `getrlimit(RLIMIT_NOFILE)` for their soft limit. Where `/proc` is
/// missing (not Linux) a reading is `nil` and its series is left out.
///
/// Thread-safety: a value type; `read()` is safe from any thread.
package struct ProcessMetrics: Equatable, Sendable {
    /// User and system CPU time, in seconds (`utime + stime` of `/proc/self/stat`).
    package var cpuSeconds: Double
    /// Resident set size, in bytes (`rss` pages of `/proc/self/stat` × page size).
    package var residentBytes: Double
    /// Virtual memory size, in bytes (`vsize` of `/proc/self/stat`).
    package var virtualBytes: Double
    /// When the process started, in seconds since the Unix epoch.
    package var startTimeSeconds: Double
    /// Open file descriptors (entries of `/proc/self/fd`), or `nil` when they cannot be listed.
    package var openFileDescriptors: Int?
    /// The soft limit on open file descriptors, or `nil` when unlimited or unknown.
    package var maxFileDescriptors: Int?

    /// Reads the metrics of this process now; `nil` where `/proc/self/stat` or `/proc/stat` cannot
    /// be read or parsed.
    package static func read() -> ProcessMetrics? {
        guard let stat = try? SmallFile.contents(of: "/proc/self/stat", maxBytes: 4096),
            let bootTime = bootTime
        else { return nil }
        let ticks = Double(sysconf(Int32(_SC_CLK_TCK)))
        let pageSize = Double(sysconf(Int32(_SC_PAGESIZE)))
        guard ticks > 0, pageSize > 0,
            var metrics = parse(
                stat: stat, ticksPerSecond: ticks, pageSize: pageSize,
                bootTime: bootTime)
        else { return nil }
        metrics.openFileDescriptors = countOpenFileDescriptors()
        var limit = rlimit()
        // rlim_t.max is RLIM_INFINITY: no limit to report.
        if getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0, limit.rlim_cur != rlim_t.max {
            metrics.maxFileDescriptors = Int(clamping: limit.rlim_cur)
        }
        return metrics
    }

    /// Parses the text of `/proc/<pid>/stat` (proc(5)): the command name in field 2 is in
    /// parentheses and may itself hold spaces and parentheses, so the fields are counted after the
    /// last `)`. Field 14 `utime`, 15 `stime`, 22 `starttime` (clock ticks), 23 `vsize` (bytes),
    /// 24 `rss` (pages). `nil` when a field is missing or not a number.
    package static func parse(
        stat: [UInt8], ticksPerSecond: Double, pageSize: Double,
        bootTime: Double
    ) -> ProcessMetrics? {
        guard let close = stat.lastIndex(of: UInt8(ascii: ")")) else { return nil }
        // Index 0 is field 3 (the state).
        let fields = stat[(close + 1)...].split(whereSeparator: { $0 == UInt8(ascii: " ") || $0 == UInt8(ascii: "\n") })
        func number(_ field: Int) -> Double? {
            let index = field - 3
            guard index < fields.count else { return nil }
            return UInt64(String(decoding: fields[index], as: UTF8.self)).map { Double($0) }
        }
        guard let user = number(14), let system = number(15), let start = number(22),
            let virtual = number(23), let resident = number(24)
        else { return nil }
        return ProcessMetrics(
            cpuSeconds: (user + system) / ticksPerSecond, residentBytes: resident * pageSize,
            virtualBytes: virtual, startTimeSeconds: bootTime + start / ticksPerSecond,
            openFileDescriptors: nil, maxFileDescriptors: nil)
    }

    /// The boot time (`btime` of `/proc/stat`), read once, on the first reading: it does not
    /// change while the process runs, and `/proc/stat` grows with the CPUs (a line per CPU, and
    /// the interrupt counts), so reading it on every scrape cost more than the process's own
    /// `/proc/self/stat`. `nil` when it cannot be read or parsed.
    private static let bootTime: Double? = {
        guard let system = try? SmallFile.contents(of: "/proc/stat", maxBytes: 1 << 20) else { return nil }
        return parseBootTime(system)
    }()

    /// The `btime` line of `/proc/stat`: boot time in seconds since the Unix epoch.
    package static func parseBootTime(_ text: [UInt8]) -> Double? {
        for line in text.split(separator: UInt8(ascii: "\n")) where line.starts(with: Array("btime ".utf8)) {
            return UInt64(String(decoding: line.dropFirst(6), as: UTF8.self)).map { Double($0) }
        }
        return nil
    }

    /// The open descriptors. Linux 6.2 and later report their count as the size of
    /// `/proc/self/fd` (one `stat`, whatever the count); before, `stat` says 0 and the entries are
    /// counted (but `.`, `..` and the descriptor of the listing itself), which costs about 1 ms of
    /// kernel time per thousand descriptors: 12 ms with 10,000 subscribers, once per scrape.
    private static func countOpenFileDescriptors() -> Int? {
        var info = stat()
        if stat("/proc/self/fd", &info) == 0, info.st_size > 0 { return Int(info.st_size) }
        return countOpenFileDescriptorsByListing()
    }

    /// The entries of `/proc/self/fd` but `.`, `..` and the descriptor of the listing itself.
    package static func countOpenFileDescriptorsByListing() -> Int? {
        guard let directory = opendir("/proc/self/fd") else { return nil }
        defer { closedir(directory) }
        var count = 0
        while let entry = readdir(directory) {
            let isDot = withUnsafeBytes(of: entry.pointee.d_name) { name in
                name[0] == UInt8(ascii: ".") && (name[1] == 0 || (name[1] == UInt8(ascii: ".") && name[2] == 0))
            }
            if !isDot { count += 1 }
        }
        // The directory stream holds a descriptor of its own while it is listed.
        return max(0, count - 1)
    }

    /// Appends the exposition lines of these metrics, with their `HELP` and `TYPE` (the names and
    /// help texts of the Prometheus client libraries).
    package func render(to out: inout PrometheusText) {
        out.single(
            "process_cpu_seconds_total", .counter, help: "Total user and system CPU time spent in seconds.", cpuSeconds)
        out.single("process_resident_memory_bytes", .gauge, help: "Resident memory size in bytes.", residentBytes)
        out.single("process_virtual_memory_bytes", .gauge, help: "Virtual memory size in bytes.", virtualBytes)
        out.single(
            "process_start_time_seconds", .gauge, help: "Start time of the process since unix epoch in seconds.",
            startTimeSeconds)
        if let openFileDescriptors {
            out.single("process_open_fds", .gauge, help: "Number of open file descriptors.", openFileDescriptors)
        }
        if let maxFileDescriptors {
            out.single("process_max_fds", .gauge, help: "Maximum number of open file descriptors.", maxFileDescriptors)
        }
    }
}

import CHiredis

/// The bounds on what a reply from Redis may make the process allocate (docs/replicas.md, "What a
/// replica trusts"): a bulk string of at most 64 KiB, an array of at most 64 elements, nesting at
/// most 4 deep, and, since those three alone still allow 64^4 elements (an attack streamed nested
/// arrays of 64 and grew RSS by 367 MB), at most 4,096 elements and 256 KiB of strings in one
/// reply, whatever its shape. Nothing this service asks for comes near them (the largest reply is
/// a sentinel's list of replicas: about 42 short fields each); a reply past them is a protocol
/// error, found before memory is spent on it.
///
/// hiredis 0.14 (read.h) gives two places for this, both used:
/// - the reader builds replies through its `redisReplyObjectFunctions`: `install` replaces them
///   with functions that refuse an array (`createArray`) over the count or the depth (counted
///   through `task->parent`) and a string over the size, and otherwise call hiredis' own. A
///   function that returns NULL fails the reader ("Out of memory" in hiredis' words), so the
///   refusal is also written where the reader's private data points, for the error to name it;
/// - the reader builds a bulk string only once all of it is buffered, so `RedisConnection` checks
///   the reader's unread bytes after each feed (`maximumUnreadBytes`).
///
/// Thread-safety: stateless; the function table is made once and never written after.
enum RedisReplyLimits {
    /// The longest bulk string accepted, in bytes: 64 KiB.
    static let maximumBulkBytes = 64 * 1024
    /// The most elements an array may have.
    static let maximumElements: Int32 = 64
    /// The deepest nesting accepted: an array in an array in an array in an array.
    static let maximumDepth = 4
    /// The most bytes one unfinished reply may hold in the reader's buffer: a whole bulk string
    /// (`maximumBulkBytes`) with its `$65536\r\n` header and final `\r\n`, rounded up to 32.
    static let maximumUnreadBytes = maximumBulkBytes + 32
    /// The most elements (strings, integers, nils and arrays, at any depth) one reply may have.
    static let maximumReplyElements = 4096
    /// The most bytes all the strings of one reply may hold together: 256 KiB.
    static let maximumReplyBytes = 256 * 1024

    /// What the reader's own functions count for the reply being built, where the reader's
    /// private data points: which bound refused it, and its elements and string bytes so far
    /// (`RedisConnection` starts them again for every reply it takes).
    struct Tally {
        /// The `Refusal` raw value, or 0.
        var refusal: Int32 = 0
        /// Elements of the reply being built.
        var elements = 0
        /// Bytes of its strings.
        var bytes = 0

        /// The next reply begins: its counts start again (a refusal stays).
        mutating func nextReply() {
            elements = 0
            bytes = 0
        }
    }

    /// Which bound a reply passed (the value written where the reader's private data points).
    enum Refusal: Int32, CustomStringConvertible {
        /// A bulk string over `maximumBulkBytes`.
        case bulk = 1
        /// An array with more than `maximumElements` (or a negative count other than -1).
        case elements = 2
        /// An array nested deeper than `maximumDepth`.
        case depth = 3
        /// A reply with more than `maximumReplyElements` elements or `maximumReplyBytes` of strings.
        case total = 4

        /// The limit, in words, for the error and its log line.
        var description: String {
            switch self {
            case .bulk: return "a bulk string may hold at most \(maximumBulkBytes) bytes"
            case .elements: return "an array may hold at most \(maximumElements) elements"
            case .depth: return "replies may nest at most \(maximumDepth) deep"
            case .total:
                return
                    "a reply may hold at most \(maximumReplyElements) elements and \(maximumReplyBytes) bytes of strings"
            }
        }
    }

    /// Makes `reader` build replies through the bounded functions, counting in `tally` (which
    /// must outlive the reader).
    static func install(on reader: UnsafeMutablePointer<redisReader>, tally: UnsafeMutablePointer<Tally>) {
        reader.pointee.fn = boundedFunctions
        reader.pointee.privdata = UnsafeMutableRawPointer(tally)
    }

    /// The tally where the task's private data (the reader's) points.
    private static func tally(_ task: UnsafePointer<redisReadTask>?) -> UnsafeMutablePointer<Tally>? {
        task?.pointee.privdata?.assumingMemoryBound(to: Tally.self)
    }

    /// Writes `refusal` to the task's tally; returns `nil`, which fails the reader.
    private static func refuse(_ task: UnsafePointer<redisReadTask>?, _ refusal: Refusal) -> UnsafeMutableRawPointer? {
        tally(task)?.pointee.refusal = refusal.rawValue
        return nil
    }

    /// Counts one more element of `bytes` string bytes; `false` when the reply passes its totals.
    private static func count(_ task: UnsafePointer<redisReadTask>?, bytes: Int = 0) -> Bool {
        guard let tally = tally(task) else { return true }
        tally.pointee.elements += 1
        tally.pointee.bytes += bytes
        return tally.pointee.elements <= maximumReplyElements && tally.pointee.bytes <= maximumReplyBytes
    }

    /// How deep `task` sits: 1 for a reply, 2 for an element of it, and so on.
    private static func depth(of task: UnsafePointer<redisReadTask>?) -> Int {
        var depth = 1
        var parent = task?.pointee.parent
        while let next = parent {
            depth += 1
            parent = next.pointee.parent
        }
        return depth
    }

    /// hiredis' own reply functions (read from a reader it made: `redisReaderCreate` points every
    /// reader at the same static table), which the bounded ones call within the bounds.
    private static let hiredisFunctions: redisReplyObjectFunctions = {
        guard let reader = redisReaderCreate() else { fatalError("hiredis could not allocate a reader") }
        defer { redisReaderFree(reader) }
        return reader.pointee.fn.pointee
    }()

    /// The bounded table every `RedisConnection`'s reader uses.
    ///
    /// `nonisolated(unsafe)`: a pointer is not `Sendable`, but this one is written once, here,
    /// before any reader can see it, and only read after (hiredis reads the table, never writes
    /// it), so no two threads ever race on it.
    nonisolated(unsafe) private static let boundedFunctions: UnsafeMutablePointer<redisReplyObjectFunctions> = {
        let table = UnsafeMutablePointer<redisReplyObjectFunctions>.allocate(capacity: 1)
        table.initialize(
            to: redisReplyObjectFunctions(
                createString: { task, bytes, length in
                    guard length <= maximumBulkBytes else { return refuse(task, .bulk) }
                    guard count(task, bytes: length) else { return refuse(task, .total) }
                    return hiredisFunctions.createString(task, bytes, length)
                },
                createArray: { task, elements in
                    guard elements >= 0, elements <= maximumElements else { return refuse(task, .elements) }
                    guard depth(of: task) <= maximumDepth else { return refuse(task, .depth) }
                    guard count(task) else { return refuse(task, .total) }
                    return hiredisFunctions.createArray(task, elements)
                },
                createInteger: { task, value in
                    guard count(task) else { return refuse(task, .total) }
                    return hiredisFunctions.createInteger(task, value)
                },
                createNil: { task in
                    guard count(task) else { return refuse(task, .total) }
                    return hiredisFunctions.createNil(task)
                },
                freeObject: { object in hiredisFunctions.freeObject(object) }))
        return table
    }()
}

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// JSON encoding through Foundation's `JSONEncoder`, with the settings every JSON text of the
/// service shares (response bodies, the state file): sorted keys, slashes not escaped.
///
/// `package` access: the HTTP layer and the stores use it; apps do not see it.
package enum JSONBody {
    /// The UTF-8 JSON text of `value`.
    package static func encode(_ value: some Encodable) -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        // Every value encoded here is a plain struct of strings, numbers and optionals:
        // encoding cannot fail, and a failure would be a programming error.
        do {
            return Array(try encoder.encode(value))
        } catch {
            preconditionFailure("JSON encoding of \(type(of: value)) failed: \(error)")
        }
    }
}

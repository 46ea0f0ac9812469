import Foundation
import TokenService
import HTTPServing

/// Names of checks to leave out, from `FORGE_FUZZ_SKIP` (comma-separated), so a known and
/// reported violation does not stop a run from looking for others. Empty by default.
let skippedChecks: Set<String> = Set(
    (ProcessInfo.processInfo.environment["FORGE_FUZZ_SKIP"] ?? "").split(separator: ",").map(String.init))

/// Stops the run, as a crash libFuzzer records with its input, when `condition` is false.
/// `context` says which request it was; `name`, when given, lets `FORGE_FUZZ_SKIP` turn it off.
func require(_ condition: @autoclosure () -> Bool, _ message: @autoclosure () -> String,
             context: @autoclosure () -> String = "", name: String? = nil,
             file: StaticString = #fileID, line: UInt = #line) {
    if let name, skippedChecks.contains(name) { return }
    guard !condition() else { return }
    let text = "INVARIANT VIOLATED\(name.map { " [\($0)]" } ?? ""): \(message())\(context().isEmpty ? "" : "\n  while handling: \(context())")\n"
    FileHandle.standardError.write(Data(text.utf8))
    fatalError("invariant violated: \(message())", file: file, line: line)
}

/// The body parsed by Foundation's `JSONSerialization`, as an object, or `nil`.
func jsonObject(_ body: [UInt8]) -> [String: Any]? {
    (try? JSONSerialization.jsonObject(with: Data(body), options: [])) as? [String: Any]
}

/// Whether `object[key]` is JSON `null`.
func isNull(_ object: [String: Any], _ key: String) -> Bool {
    object[key] is NSNull
}

/// A JSON `true`/`false` as `Bool` (not a number that happens to bridge).
func jsonBool(_ object: [String: Any], _ key: String) -> Bool? {
    object[key] as? Bool
}

func lowercaseHex(_ bytes: [UInt8]) -> String {
    let digits = Array("0123456789abcdef".utf8)
    var out: [UInt8] = []
    out.reserveCapacity(bytes.count * 2)
    for byte in bytes {
        out.append(digits[Int(byte >> 4)])
        out.append(digits[Int(byte & 0x0f)])
    }
    return String(decoding: out, as: UTF8.self)
}

/// 2 to 512 digits `[0-9a-f]`, an even number of them: a token as the service stores it.
func isStoredToken(_ text: String) -> Bool {
    let utf8 = text.utf8
    return (2...512).contains(utf8.count) && utf8.count % 2 == 0
        && utf8.allSatisfy { ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x61 && $0 <= 0x66) }
}

/// A machine-readable error code: snake_case ASCII.
func isErrorCode(_ text: String) -> Bool {
    !text.isEmpty && text.utf8.allSatisfy { ($0 >= 0x61 && $0 <= 0x7a) || ($0 >= 0x30 && $0 <= 0x39) || $0 == 0x5f }
}

/// A short, escaped description of a request for failure messages.
func describe(_ request: HTTPRequest) -> String {
    let headers = request.headers.fields.map { "\($0.name): \($0.value)" }
    let body = request.body.count <= 64 ? String(reflecting: String(decoding: request.body, as: UTF8.self))
        : "\(request.body.count) bytes"
    return "\(String(reflecting: request.method)) \(String(reflecting: request.path))"
        + (request.query.map { " query \(String(reflecting: $0))" } ?? "")
        + " headers \(headers) body \(body)"
}

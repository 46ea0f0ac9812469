import HTTPServing
import ServerSupport

/// The contents of a token file (`--write-token-file`, `--read-token-file`; docs/operations.md,
/// "Read and write tokens"): 1 to 64 tokens, one a line. Blank lines and lines starting with `#` are
/// skipped; blanks (spaces, tabs, and so a CRLF line end's carriage return) around a line are
/// trimmed. A token is 16 to 512 RFC 6750 `b64token` characters (`BearerAuthentication`).
///
/// Pure: the executable reads the file (at start and at every reload) and hands its bytes here.
/// An error names the line and the reason, never the token or any of its characters.
public enum TokenFile {
    /// Most tokens in one file.
    public static let maxTokens = 64
    /// Fewest and most characters of one token.
    public static let tokenLength = 16...512

    /// Why a file was refused: the 1-based line, when one is at fault, and the reason.
    public struct Error: Swift.Error, Equatable, Sendable, CustomStringConvertible {
        /// The 1-based line number, or `nil` when the file as a whole is at fault (no token).
        public let line: Int?
        /// What is wrong, in words; never a token or a character of one.
        public let reason: String

        /// `line 3: the token has 15 characters; a token has 16 to 512`, or the reason alone.
        public var description: String { line.map { "line \($0): \(reason)" } ?? reason }
    }

    /// The tokens of a file's `contents`, in order (repeats kept: `BearerAuthentication` counts
    /// each once).
    /// - Throws: `Error` for a line that is not a valid token, for a 65th token, or for a file
    ///   without a token.
    public static func parse(_ contents: [UInt8]) throws(Error) -> [String] {
        var tokens: [String] = []
        var number = 0
        for line in contents.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false) {
            number += 1
            var start = line.startIndex
            var end = line.endIndex
            while start < end, isBlank(line[start]) { start += 1 }
            while end > start, isBlank(line[end - 1]) { end -= 1 }
            let trimmed = line[start..<end]
            guard let first = trimmed.first, first != UInt8(ascii: "#") else { continue }
            guard tokens.count < maxTokens else {
                throw Error(line: number, reason: "one token more than the \(maxTokens) a file may hold")
            }
            if let offset = BearerAuthentication.invalidTokenByte(trimmed) {
                throw Error(
                    line: number,
                    reason: "character \(offset + 1) of the token is not allowed: a token holds only "
                        + "A-Z a-z 0-9 - . _ ~ + / (then any '='), as a Bearer token must (RFC 6750 §2.1)")
            }
            guard tokenLength.contains(trimmed.count) else {
                throw Error(
                    line: number,
                    reason: "the token has \(trimmed.count) characters; a token has \(tokenLength.lowerBound) "
                        + "to \(tokenLength.upperBound) (try: openssl rand -hex 32)")
            }
            tokens.append(String(decoding: trimmed, as: UTF8.self))
        }
        guard !tokens.isEmpty else {
            throw Error(line: nil, reason: "no token: every line is blank or a comment")
        }
        return tokens
    }

    private static func isBlank(_ byte: UInt8) -> Bool {
        byte == UInt8(ascii: " ") || byte == UInt8(ascii: "\t") || byte == UInt8(ascii: "\r")
    }
}

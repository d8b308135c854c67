import Foundation

/// Text rules of HTTP that every request meets, with a fast path for the usual case: header names
/// already in lower case, path and query text without escapes. Foundation's general routines allocate
/// and walk Unicode even when there is nothing to change.
public enum HTTPText {
    /// A header name in lower case. Names are tokens (ASCII); anything else goes through `lowercased()`.
    public static func lowercasedName(_ name: String) -> String {
        var needsWork = false
        for byte in name.utf8 where byte >= 0x80 || (byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z")) {
            needsWork = true
            break
        }
        return needsWork ? name.lowercased() : name
    }

    /// Percent-escapes decoded (`%2F` → `/`), and `+` read as a space when `plusIsSpace` (form and query
    /// encoding). Text that is not valid after decoding (a lone `%`, bytes that are not UTF-8) is returned as it came.
    public static func percentDecoded(_ text: Substring, plusIsSpace: Bool = false) -> String {
        var escaped = false
        for byte in text.utf8 where byte == UInt8(ascii: "%") || (plusIsSpace && byte == UInt8(ascii: "+")) {
            escaped = true
            break
        }
        guard escaped else { return String(text) }
        let spaced = plusIsSpace ? text.replacingOccurrences(of: "+", with: " ") : String(text)
        return spaced.removingPercentEncoding ?? String(text)
    }

    /// Whether a path is already canonical (`Request.canonical`): starts with `/`, no empty segment, no
    /// trailing `/` past the root. ASCII is checked byte by byte; other text by characters, as the router
    /// splits it (a combining mark after `/` makes one character that is not a slash).
    static func isCanonicalPath(_ path: String) -> Bool {
        let bytes = path.utf8
        var previousWasSlash = false
        for byte in bytes {
            guard byte < 0x80 else {
                return !(path.contains("//") || (path.count > 1 && path.hasSuffix("/")) || !path.hasPrefix("/"))
            }
            let slash = byte == UInt8(ascii: "/")
            if slash && previousWasSlash { return false }
            previousWasSlash = slash
        }
        return bytes.first == UInt8(ascii: "/") && !(previousWasSlash && bytes.count > 1)
    }
}

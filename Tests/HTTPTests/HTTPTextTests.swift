import Foundation
import HTTP
import Testing

/// `HTTPText`'s fast paths must give what Foundation's general routines give, on every input.
@Suite("HTTP text rules")
struct HTTPTextTests {
    /// Random text over an alphabet chosen to hit every branch: escapes valid and broken, `+`, slashes,
    /// upper case, non-ASCII (a combining mark that can join a `/`), NUL.
    static func randomText(_ generator: inout some RandomNumberGenerator) -> String {
        let pieces = ["%", "%2", "%2F", "%2f", "%41", "%e2%82%ac", "%FF", "%zz", "+", "/", "//", "a", "Z", "Content-Type", "é", "\u{301}",
                      "\u{0}", " ", "?", "=", "&", "€"]
        return (0..<Int.random(in: 0...8, using: &generator)).map { _ in pieces.randomElement(using: &generator)! }.joined()
    }

    @Test("Percent decoding equals Foundation's, with and without + as a space")
    func percentDecoding() {
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<5_000 {
            let text = Self.randomText(&generator)
            #expect(HTTPText.percentDecoded(text[...]) == (text.removingPercentEncoding ?? text), "\(text.debugDescription)")
            let spaced = text.replacingOccurrences(of: "+", with: " ")
            #expect(HTTPText.percentDecoded(text[...], plusIsSpace: true) == (spaced.removingPercentEncoding ?? text), "\(text.debugDescription)")
        }
        // Slices that do not start at the string's start (a query's values are).
        for _ in 0..<1_000 {
            let text = Self.randomText(&generator), prefix = Self.randomText(&generator)
            let whole = prefix + "#" + text
            let mark = whole.utf8.firstIndex(of: UInt8(ascii: "#"))!
            let slice = whole[whole.utf8.index(after: mark)...]
            #expect(HTTPText.percentDecoded(slice, plusIsSpace: true) == HTTPText.percentDecoded(text[...], plusIsSpace: true), "\(whole.debugDescription)")
        }
        #expect(HTTPText.percentDecoded("a%20b+c", plusIsSpace: true) == "a b c")
        #expect(HTTPText.percentDecoded("a%20b+c") == "a b+c")
        #expect(HTTPText.percentDecoded("100%") == "100%")
    }

    @Test("Header names are lower-cased as lowercased() does")
    func headerNames() {
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<5_000 {
            let name = Self.randomText(&generator)
            #expect(HTTPText.lowercasedName(name) == name.lowercased(), "\(name.debugDescription)")
        }
        #expect(Request(method: .get, target: "/", headers: ["X-Thing": "1"]).header("x-THING") == "1")
    }

    @Test("Canonical paths: kept when already canonical, else split on slashes and joined; twice is once for ASCII")
    func canonicalPaths() {
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<5_000 {
            let path = Self.randomText(&generator)
            let canonical = Request.canonical(path)
            // The general rule, by characters.
            let kept = !(path.contains("//") || (path.count > 1 && path.hasSuffix("/")) || !path.hasPrefix("/"))
            #expect(canonical == (kept ? path : "/" + path.split(separator: "/").joined(separator: "/")), "\(path.debugDescription)")
            // Twice is once for ASCII. (Not for a combining mark after a slash: that pair is one character, no slash.)
            if path.utf8.allSatisfy({ $0 < 0x80 }) { #expect(Request.canonical(canonical) == canonical, "\(path.debugDescription)") }
        }
        #expect(Request.canonical("//admin/v1/x/") == "/admin/v1/x")
        #expect(Request.canonical("/") == "/")
        #expect(Request.canonical("") == "/")
    }
}

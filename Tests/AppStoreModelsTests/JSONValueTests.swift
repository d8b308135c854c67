import AppStoreModels
import Foundation
import Testing

@Suite("JSON reader")
struct JSONValueTests {
    @Test("Objects, arrays, numbers, literals and escaped strings read as written")
    func values() throws {
        let text = #"{"a":[1,-2.5e3,0,true,false,null],"s":"q\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00","n":{"k":"v"},"e":{},"l":[]}"#
        let json = try JSONValue.parse(Array(text.utf8))
        #expect(json["a"] == .array([.number("1"), .number("-2.5e3"), .number("0"), .bool(true), .bool(false), .null]))
        #expect(json["s"]?.text == "q\"\\/\u{8}\u{c}\n\r\té😀")
        #expect(json["n"]?["k"]?.text == "v")
        #expect(json["e"] == .object([:]))
        #expect(json["l"] == .array([]))
        #expect(json["missing"] == nil)
    }

    @Test("Numeric strings and numbers both read as ids and flags")
    func lenient() throws {
        let json = try JSONValue.parse(Array(#"{"id":"1000000001","n":1000000002,"t":1,"f":"false"}"#.utf8))
        #expect(json["id"]?.int64 == 1_000_000_001)
        #expect(json["n"]?.text == "1000000002")
        #expect(json["t"]?.bool == true)
        #expect(json["f"]?.bool == false)
    }

    @Test("Malformed texts are refused with the offending offset", arguments: [
        "", "{", "[1,]", "{\"a\" 1}", "{\"a\":1,}", "01", "1.", "-", "\"abc", "\"a\u{1}b\"", "\"\\x\"", "\"\\ud800\"", "tru",
        "{} extra", "<html><body>Service Unavailable</body></html>", String(repeating: "[", count: 200) + String(repeating: "]", count: 200),
    ])
    func malformed(text: String) {
        #expect(throws: JSONParseError.self) { try JSONValue.parse(Array(text.utf8)) }
    }

    @Test("Long strings read whole wherever their quote, escape or control character falls (eight bytes at a time before it)")
    func longStrings() throws {
        var generator = SystemRandomNumberGenerator()
        let plain = Array("abcdefghijklmnopqrstuvwxyz0123456789+/=é😀".unicodeScalars)
        for length in 0..<70 {
            for special in ["", "\"", "\\", "\n", "\u{0}"] {
                var text = String(String.UnicodeScalarView((0..<length).map { _ in plain.randomElement(using: &generator)! }))
                let position = Int.random(in: 0...text.unicodeScalars.count, using: &generator)
                let index = text.unicodeScalars.index(text.unicodeScalars.startIndex, offsetBy: position)
                text.unicodeScalars.insert(contentsOf: special.unicodeScalars, at: index)
                let encoded = try JSONSerialization.data(withJSONObject: ["s": text], options: [.fragmentsAllowed])
                #expect(try JSONValue.parse(Array(encoded))["s"]?.text == text)
                // A control character written raw is refused wherever it falls.
                if special == "\n" || special == "\u{0}" {
                    #expect(throws: JSONParseError.self) { try JSONValue.parse(Array(#"{"s":""#.utf8) + Array(text.utf8) + Array(#""}"#.utf8)) }
                }
            }
            let raw = Array("[\"".utf8) + Array(repeating: UInt8(ascii: "a"), count: length) + [0x1f] + Array("\"]".utf8)
            #expect(throws: JSONParseError.self) { try JSONValue.parse(raw) }
        }
    }

    @Test("App Store ids are ASCII digits only: other scripts' digits, fractions and numerals are not", arguments: [
        ("2000000123456789", true), ("0", true), ("", false), ("12a", false), (" 12", false), ("١٢٣", false), ("１２３", false),
        ("½", false), ("Ⅻ", false), ("12\u{0}", false), ("-1", false),
    ])
    func appStoreIds(text: String, digits: Bool) {
        #expect(text.isASCIIDigits == digits)
        #expect(text[...].isASCIIDigits == digits)
    }

    @Test("Agrees with JSONSerialization on a verifyReceipt answer")
    func agreesWithFoundation() throws {
        let text = #"{"status":0,"environment":"Sandbox","receipt":{"bundle_id":"com.example.coins","in_app":[{"quantity":"1","product_id":"Nada.JPYF01","transaction_id":"1000000001","purchase_date_ms":"1700000000000"}]},"is_retryable":false}"#
        let ours = try JSONValue.parse(Array(text.utf8))
        let foundation = try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any] ?? [:]
        #expect(ours["status"]?.int64 == (foundation["status"] as? NSNumber)?.int64Value)
        let inApp = ((foundation["receipt"] as? [String: Any])?["in_app"] as? [[String: Any]])?.first
        #expect(ours["receipt"]?["in_app"]?.array?.first?["transaction_id"]?.text == inApp?["transaction_id"] as? String)
        #expect(ours["is_retryable"]?.bool == foundation["is_retryable"] as? Bool)
    }
}

import AppStoreCrypto
import AppStoreModels
import Foundation
import Testing

@Suite("appAccountToken")
struct AppAccountTokenTests {
    @Test("Version-5 UUIDs match RFC 9562's example")
    func rfcVector() {
        let dns = UUID(uuidString: "6ba7b810-9dad-11d1-80b4-00c04fd430c8")!
        #expect(AppAccountToken.nameBased("www.example.com", in: dns) == UUID(uuidString: "2ed6657d-e927-568b-95e1-2665a8aea6a2"))
    }

    @Test("A UUID user id is its own token; any other id maps to one stable token of its own")
    func tokens() {
        #expect(AppAccountToken.token(for: "5B4E7A1C-0D8E-4C43-9A4E-2F2B6F3F6C11") == UUID(uuidString: "5b4e7a1c-0d8e-4c43-9a4e-2f2b6f3f6c11"))
        #expect(AppAccountToken.token(for: "alice") == AppAccountToken.token(for: "alice"))
        #expect(AppAccountToken.token(for: "alice") != AppAccountToken.token(for: "alicf"))
        #expect(AppAccountToken.token(for: "alice").uuidString.lowercased().dropFirst(14).first == "5")
        #expect(AppAccountToken.matches(AppAccountToken.token(for: "bob").uuidString.lowercased(), user: "bob"))
        #expect(!AppAccountToken.matches(AppAccountToken.token(for: "bob").uuidString, user: "mallory"))
        #expect(!AppAccountToken.matches("not-a-uuid", user: "bob"))
    }

    @Test("Only a UUID as Apple writes it is one: Foundation's laxer forms on Linux are other user ids, with tokens of their own")
    func strictUUIDs() {
        let canonical = "7d0c3c04-6a8e-4f0e-9d3a-2c5e8f1a7b64"
        #expect(UUIDText.parse(canonical) == UUID(uuidString: canonical))
        #expect(UUIDText.parse(canonical.uppercased()) == UUID(uuidString: canonical))
        #expect(UUIDText.parse("7D0c3C04-6a8E-4f0e-9D3A-2c5e8f1a7b64") == UUID(uuidString: canonical))
        // Foundation on Linux reads each of these as a UUID (sscanf skips spaces and takes signs and 0x in a group);
        // the first as this very one.
        let lax = [" 7d0c3c4-6a8e-4f0e-9d3a-2c5e8f1a7b64", "+7d0c3c4-6a8e-4f0e-9d3a-2c5e8f1a7b64", "0x7d0c3c-6a8e-4f0e-9d3a-2c5e8f1a7b64",
                   "7d0c3c04-6a8e-4f0e-9d3a- c5e8f1a7b64", "7d0c3c04-6a8e-4f0e-9d3a--c5e8f1a7b64"]
        for text in lax {
            #expect(UUIDText.parse(text) == nil, "\(text)")
            #expect(AppAccountToken.token(for: text) != AppAccountToken.token(for: canonical), "\(text)")
            #expect(!AppAccountToken.matches(canonical, user: text), "\(text)")
        }
        for text in ["", String(canonical.dropLast()), canonical + "0", canonical.replacingOccurrences(of: "-", with: "+"),
                     "7d0c3c046a8e-4f0e-9d3a-2c5e8f1a7b64-", "7d0c3c04-6a8e-4f0e-9d3a-2c5e8f1a7b6g", "7d0c3c04-6a8e-4f0e-9d3a-2c5e8f1a7bé",
                     "{d0c3c04-6a8e-4f0e-9d3a-2c5e8f1a7b64", "7d0c3c04-6a8e-4f0e-9d3a-2c5e8f1a7b6\u{0}"] {
            #expect(UUIDText.parse(text) == nil, "\(text)")
        }
        // Every byte value in every place: only hex digits and the four hyphens make a UUID, and it reads as Foundation reads it.
        for offset in 0..<36 {
            for byte in UInt8(0)...UInt8(127) {
                var bytes = Array(canonical.utf8)
                bytes[offset] = byte
                let text = String(decoding: bytes, as: UTF8.self)
                let valid = [8, 13, 18, 23].contains(offset) ? byte == UInt8(ascii: "-")
                    : (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) || (UInt8(ascii: "a")...UInt8(ascii: "f")).contains(byte)
                        || (UInt8(ascii: "A")...UInt8(ascii: "F")).contains(byte)
                #expect((UUIDText.parse(text) != nil) == valid, "\(offset) \(byte)")
                if valid { #expect(UUIDText.parse(text) == UUID(uuidString: text)) }
            }
        }
    }
}

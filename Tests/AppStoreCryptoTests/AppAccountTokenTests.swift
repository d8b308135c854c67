import AppStoreCrypto
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
}

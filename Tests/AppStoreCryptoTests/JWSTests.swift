import AppStoreCrypto
import AppStoreModels
import Foundation
import Testing

@Suite("JWS (ES256 with an x5c chain)")
struct JWSTests {
    struct Chain {
        let root: Certificate, intermediate: Certificate, leaf: Certificate, leafKey: PrivateKey
        var x5c: [Certificate] { [leaf, intermediate, root] }
    }

    static func makeChain(markers: Bool = true) throws -> Chain {
        let start = Date(timeIntervalSince1970: 946_684_800), end = Date(timeIntervalSince1970: 4_102_444_799)
        let rootKey = try PrivateKey.generateEC(), intermediateKey = try PrivateKey.generateEC(), leafKey = try PrivateKey.generateEC()
        let root = try CertificateBuilder(subject: [("CN", "JWS Test Root")], serial: 1, notBefore: start, notAfter: end, isCertificateAuthority: true)
            .issue(for: rootKey, issuer: nil, issuerKey: rootKey)
        let intermediate = try CertificateBuilder(subject: [("CN", "JWS Test Intermediate")], serial: 2, notBefore: start, notAfter: end,
                                                  isCertificateAuthority: true, pathLength: 0,
                                                  markerExtensions: markers ? [OID.appleWWDRIntermediate] : [])
            .issue(for: intermediateKey, issuer: root, issuerKey: rootKey)
        let leaf = try CertificateBuilder(subject: [("CN", "JWS Test Leaf")], serial: 3, notBefore: start, notAfter: end,
                                          isCertificateAuthority: false, markerExtensions: markers ? [OID.appleReceiptSigner] : [])
            .issue(for: leafKey, issuer: intermediate, issuerKey: intermediateKey)
        return Chain(root: root, intermediate: intermediate, leaf: leaf, leafKey: leafKey)
    }

    static let payload = Array(#"{"transactionId":"2000000000000001","signedDate":1768471200000}"#.utf8)

    @Test("What we sign verifies with our root and decodes to the same payload; the signature is raw 64-byte R‖S")
    func roundTrip() throws {
        let chain = try Self.makeChain()
        let compact = try JWS.sign(payload: Self.payload, key: chain.leafKey, chain: chain.x5c)
        let jws = try JWS(compact: compact)
        #expect(jws.payload == Self.payload)
        #expect(jws.signature.count == 64)
        #expect(jws.header["alg"]?.text == "ES256")
        #expect(try jws.certificates().map(\.der) == chain.x5c.map(\.der))
        let leaf = try jws.verify(with: ChainVerifier(roots: [chain.root]), at: Date(timeIntervalSince1970: 1_768_471_200))
        #expect(leaf.der == chain.leaf.der)
    }

    @Test("An x5c entry is its certificate's exact DER in standard Base64: bytes after it, a longer length form, or Base64 that is not the bytes' own are refused")
    func x5cHasOneSpelling() throws {
        let chain = try Self.makeChain()
        let der = chain.leaf.der
        let text = Data(der).base64EncodedString()
        #expect(try JWS.certificate(x5c: text).der == der)
        // The outer SEQUENCE's length in a longer form than DER allows (0x82 LL LL → 0x83 00 LL LL).
        try #require(der[0] == 0x30 && der[1] == 0x82)
        let longer = [0x30, 0x83, 0x00] + der[2...]
        let trailing = der + [0x00]
        // The same bytes under another Base64 text: the last group's unused bits set (or, if no bits are unused, a line break).
        var respelt = Array(text.utf8)
        if let pad = respelt.firstIndex(of: UInt8(ascii: "=")) {
            let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)
            let value = alphabet.firstIndex(of: respelt[pad - 1])!
            respelt[pad - 1] = alphabet[value | (respelt[pad...].count == 2 ? 0x0F : 0x03)]
        } else {
            respelt.insert(UInt8(ascii: "\n"), at: 64)
        }
        for (spelling, entry) in [("longer length", Data(longer).base64EncodedString()), ("bytes after", Data(trailing).base64EncodedString()),
                                  ("Base64 respelt", String(decoding: respelt, as: UTF8.self))] {
            #expect(throws: CryptoError.self, "\(spelling)") { try JWS.certificate(x5c: entry) }
            // Inside a signed JWS, the whole check refuses it before any chain is verified.
            let header = Array(try JSONSerialization.data(withJSONObject: ["alg": "ES256", "x5c": [entry, Data(chain.intermediate.der).base64EncodedString(),
                                                                                                     Data(chain.root.der).base64EncodedString()]]))
            let input = Base64URL.encode(header) + "." + Base64URL.encode(Self.payload)
            let jws = try JWS(compact: input + "." + Base64URL.encode(try chain.leafKey.signES256(Array(input.utf8))))
            #expect(throws: CryptoError.self, "\(spelling)") { try jws.verify(with: ChainVerifier(roots: [chain.root]), at: Date(timeIntervalSince1970: 1_768_471_200)) }
        }
    }

    @Test("A changed payload, another root, a short chain, another alg and missing Apple OIDs are all refused")
    func refusals() throws {
        let chain = try Self.makeChain()
        let date = Date(timeIntervalSince1970: 1_768_471_200)
        let compact = try JWS.sign(payload: Self.payload, key: chain.leafKey, chain: chain.x5c)
        let parts = compact.split(separator: ".").map(String.init)
        let tampered = parts[0] + "." + Base64URL.encode(Array(#"{"transactionId":"2000000000000002","signedDate":1768471200000}"#.utf8)) + "." + parts[2]
        #expect(throws: CryptoError.self) { try JWS(compact: tampered).verify(with: ChainVerifier(roots: [chain.root]), at: date) }

        let other = try Self.makeChain()
        #expect(throws: CryptoError.self) { try JWS(compact: compact).verify(with: ChainVerifier(roots: [other.root]), at: date) }

        let short = try JWS.sign(payload: Self.payload, key: chain.leafKey, chain: [chain.leaf, chain.intermediate])
        #expect(throws: CryptoError.self) { try JWS(compact: short).verify(with: ChainVerifier(roots: [chain.root]), at: date) }

        let hs256Header = Base64URL.encode(Array(#"{"alg":"HS256","x5c":[]}"#.utf8))
        #expect(throws: CryptoError.self) { try JWS(compact: hs256Header + "." + parts[1] + "." + parts[2]).verify(with: ChainVerifier(roots: [chain.root]), at: date) }

        let plain = try Self.makeChain(markers: false)
        let unmarked = try JWS.sign(payload: Self.payload, key: plain.leafKey, chain: plain.x5c)
        #expect(throws: CryptoError.self) { try JWS(compact: unmarked).verify(with: ChainVerifier(roots: [plain.root]), at: date) }
    }

    @Test("x5c is counted before any certificate is parsed; oversized headers and bodies are refused first")
    func boundedBeforeWork() throws {
        let chain = try Self.makeChain()
        let date = Date(timeIntervalSince1970: 1_768_471_200)
        let payload = Base64URL.encode(Self.payload)
        func code(_ compact: String) -> String? {
            do { try JWS(compact: compact).verify(with: ChainVerifier(roots: [chain.root]), at: date); return nil } catch let error as CryptoError {
                return error.code
            } catch { return "other" }
        }
        // Entries that are not even Base64: parsing any of them would fail with invalid_certificate.
        let many = Base64URL.encode(Array(("{\"alg\":\"ES256\",\"x5c\":[" + Array(repeating: "\"!\"", count: 2000).joined(separator: ",") + "]}").utf8))
        #expect(code(many + "." + payload + ".AAAA") == "invalid_chain_length")
        let four = Base64URL.encode(Array(#"{"alg":"ES256","x5c":["!","!","!","!"]}"#.utf8))
        #expect(code(four + "." + payload + ".AAAA") == "invalid_chain_length")
        let hugeHeader = Base64URL.encode(Array(("{\"alg\":\"ES256\",\"pad\":\"" + String(repeating: "x", count: JWS.maximumHeaderLength) + "\"}").utf8))
        #expect(code(hugeHeader + "." + payload + ".AAAA") == "invalid_jws_format")
        #expect(code(String(repeating: "A", count: JWS.maximumCompactLength + 1)) == "invalid_jws_format")
    }

    @Test("Malformed compact forms are format errors", arguments: ["", "a.b", "a.b.c.d", "!!!.e30.e30", "e30.e30.@@", "W10.e30.e30"])
    func malformed(text: String) {
        #expect(throws: CryptoError.self) { try JWS(compact: text) }
    }

    @Test("Base64url round-trips every length without padding")
    func base64url() {
        for length in 0..<40 {
            let bytes = (0..<length).map { UInt8(truncatingIfNeeded: $0 * 37 + 250) }
            let text = Base64URL.encode(bytes)
            #expect(!text.contains("=") && !text.contains("+") && !text.contains("/"))
            #expect(Base64URL.decode(text) == bytes)
        }
    }
}

@Suite("Base64url")
struct Base64URLTests {
    @Test("Encoding agrees with Foundation's Base64 in the URL alphabet without padding, and decodes back")
    func agreesWithFoundation() {
        for length in 0..<300 {
            let bytes = (0..<length).map { _ in UInt8.random(in: 0...255) }
            var expected = Data(bytes).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            while expected.hasSuffix("=") { expected.removeLast() }
            let encoded = Base64URL.encode(bytes)
            #expect(encoded == expected)
            #expect(Base64URL.decode(encoded) == bytes || (length == 0 && Base64URL.decode(encoded) == nil))
        }
    }

    @Test("A character outside the alphabet anywhere, in a full group or the last short one, is refused; so is one lone last character")
    func refusesOutsideTheAlphabet() {
        for length in 1..<12 {
            let encoded = Array(Base64URL.encode((0..<length).map { UInt8(truncatingIfNeeded: $0 * 91 + 7) }).utf8)
            for position in encoded.indices {
                for bad in [UInt8(ascii: "="), UInt8(ascii: "."), UInt8(ascii: " "), 0, 0x80, 0xFF] {
                    var broken = encoded
                    broken[position] = bad
                    #expect(broken.withUnsafeBufferPointer { Base64URL.decode($0) } == nil)
                }
            }
        }
        #expect(Base64URL.decode("A") == nil)
        #expect(Base64URL.decode("AAAAA") == nil)
        #expect(Base64URL.decode("-_8") == [0xFB, 0xFF])
        #expect(Base64URL.decode("+/8") == nil)  // the standard alphabet's two characters are not JWS's
        #expect(Base64URL.decode("+/8", alphabet: .standard) == [0xFB, 0xFF])
        #expect(Base64URL.decode("-_8", alphabet: .standard) == nil)
    }

    @Test("Only the canonical spelling decodes: a last character with unused bits set is refused, so one value has one text")
    func canonicalOnly() {
        for length in 0..<40 {
            let bytes = (0..<length).map { UInt8(truncatingIfNeeded: $0 * 53 + 11) }
            let encoded = Array(Base64URL.encode(bytes).utf8)
            #expect(encoded.withUnsafeBufferPointer { Base64URL.decode($0) } == bytes || (length == 0))
            // Every other spelling of the last character: it decodes only when it is the encoder's.
            guard length % 3 != 0, let last = encoded.last else { continue }
            var accepted: [UInt8] = []
            for candidate in Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8) {
                var respelt = encoded
                respelt[respelt.count - 1] = candidate
                if let decoded = respelt.withUnsafeBufferPointer({ Base64URL.decode($0) }) {
                    accepted.append(candidate)
                    #expect(decoded.count == bytes.count)
                }
            }
            // The last character carries 2 bits (two left) or 4 bits (three left) of data: 4 or 16 spellings decode,
            // one for each value those bits take, and the encoder's is among them.
            #expect(accepted.count == (length % 3 == 1 ? 4 : 16))
            #expect(accepted.contains(last))
        }
    }

    @Test("A JWS whose signature is re-spelt (the standard alphabet, or unused bits set) is refused before its signature is checked")
    func respeltSignature() throws {
        let jws = try JWS.sign(payload: Array("{}".utf8), key: try PrivateKey.generateEC())
        let parts = jws.split(separator: ".").map(String.init)
        let signature = parts[2]
        // A P-256 signature is 64 bytes: 86 characters, the last carrying 2 bits of data and 4 unused.
        #expect(signature.utf8.count == 86)
        let last = Array(signature.utf8).last!
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)
        let index = alphabet.firstIndex(of: last)!
        var respelt = Array(signature.utf8)
        respelt[respelt.count - 1] = alphabet[index | 1]
        #expect(throws: CryptoError.self) { try JWS(compact: parts[0] + "." + parts[1] + "." + String(decoding: respelt, as: UTF8.self)) }
        let standard = signature.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        if standard != signature {
            #expect(throws: CryptoError.self) { try JWS(compact: parts[0] + "." + parts[1] + "." + standard) }
        }
        #expect(throws: Never.self) { try JWS(compact: jws) }
    }
}

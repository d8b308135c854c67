import AppStoreCrypto
import Testing

@Suite("Digests")
struct DigestTests {
    @Test("SHA-1, SHA-256 and SHA-384 of known vectors, from contiguous and non-contiguous bytes")
    func knownVectors() {
        let abc = Array("abc".utf8)
        #expect(Digest.sha1.hash(abc).hexString == "a9993e364706816aba3e25717850c26c9cd0d89d")
        #expect(Digest.sha256.hash(abc).hexString == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        #expect(Digest.sha384.hash(abc).count == 48)
        // A lazy collection has no contiguous storage: the same digest through the copying path.
        #expect(Digest.sha256.hash(abc.lazy.map { $0 }) == Digest.sha256.hash(abc))
        #expect(Digest.sha256.hash("abc".utf8) == Digest.sha256.hash(abc))
        #expect(Digest.sha256.hash([UInt8]()).hexString == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
    }

    @Test("HMAC-SHA256 of RFC 4231's vectors, an empty key and message, and a key longer than a block")
    func hmacVectors() {
        #expect(HMAC.sha256(key: Array("Jefe".utf8), message: Array("what do ya want for nothing?".utf8)).hexString
            == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
        #expect(HMAC.sha256(key: [UInt8](repeating: 0x0b, count: 20), message: Array("Hi There".utf8)).hexString
            == "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7")
        // Test case 6: a 131-byte key is hashed first.
        #expect(HMAC.sha256(key: [UInt8](repeating: 0xaa, count: 131),
                            message: Array("Test Using Larger Than Block-Size Key - Hash Key First".utf8)).hexString
            == "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54")
        #expect(HMAC.sha256(key: [UInt8](), message: [UInt8]()).hexString
            == "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad")
    }

    @Test("Hex is two lower-case digits per byte, from any sequence")
    func hex() {
        #expect([UInt8]().hexString == "")
        #expect([0x00, 0x0f, 0xa0, 0xff].hexString == "000fa0ff")
        #expect((0...255).map(UInt8.init).hexString.count == 512)
        #expect(stride(from: UInt8(0), through: 3, by: 1).hexString == "00010203")
    }
}

@Suite("Signing and verifying from set-up contexts")
struct SignatureContextTests {
    static let message = Array("receipt payload".utf8)

    @Test("One key signs and verifies again and again, under each digest in turn, a bad signature between good ones",
          arguments: ["RSA", "EC"])
    func repeated(kind: String) throws {
        let key = kind == "RSA" ? try PrivateKey.generateRSA() : try PrivateKey.generateEC()
        let publicKey = key.publicKey
        for round in 0..<3 {
            for digest in [Digest.sha1, .sha256, .sha384] {
                let message = Self.message + [UInt8(round)]
                let signature = try key.sign(message, digest: digest)
                // A verification finishes its context: a second one from the same context would fail.
                #expect(publicKey.isValidSignature(signature, for: message, digest: digest))
                #expect(publicKey.isValidSignature(signature, for: message, digest: digest))
                #expect(!publicKey.isValidSignature(signature, for: message + [0], digest: digest))
                #expect(!publicKey.isValidSignature(Array(signature.dropLast()), for: message, digest: digest))
                #expect(publicKey.isValidSignature(signature, for: message, digest: digest))
                // Signed under one digest, checked under another: refused.
                let other: Digest = digest == .sha256 ? .sha384 : .sha256
                #expect(!publicKey.isValidSignature(signature, for: message, digest: other))
            }
        }
        // Another key's signature is refused by this one.
        let stranger = kind == "RSA" ? try PrivateKey.generateRSA() : try PrivateKey.generateEC()
        #expect(!publicKey.isValidSignature(try stranger.sign(Self.message, digest: .sha256), for: Self.message, digest: .sha256))
    }

    @Test("Eight threads share one key pair: every signature verifies and every forgery is refused")
    func concurrent() async throws {
        let key = try PrivateKey.generateEC()
        let publicKey = key.publicKey
        let outcomes = try await withThrowingTaskGroup(of: (good: Int, refused: Int).self) { group in
            for worker in 0..<8 {
                group.addTask {
                    var good = 0, refused = 0
                    for index in 0..<50 {
                        let message = Self.message + [UInt8(worker), UInt8(index)]
                        let signature = try key.signES256(message)
                        if publicKey.isValidES256(signature, for: message) { good += 1 }
                        if !publicKey.isValidES256(signature, for: message + [1]) { refused += 1 }
                    }
                    return (good, refused)
                }
            }
            return try await group.reduce(into: [(good: Int, refused: Int)]()) { $0.append($1) }
        }
        #expect(outcomes.map(\.good) == Array(repeating: 50, count: 8))
        #expect(outcomes.map(\.refused) == Array(repeating: 50, count: 8))
    }
}

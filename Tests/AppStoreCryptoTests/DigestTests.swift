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

    @Test("Hex is two lower-case digits per byte, from any sequence")
    func hex() {
        #expect([UInt8]().hexString == "")
        #expect([0x00, 0x0f, 0xa0, 0xff].hexString == "000fa0ff")
        #expect((0...255).map(UInt8.init).hexString.count == 512)
        #expect(stride(from: UInt8(0), through: 3, by: 1).hexString == "00010203")
    }
}

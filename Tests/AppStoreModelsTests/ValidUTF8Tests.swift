import AppStoreModels
import Testing

@Suite("UTF-8 validation")
struct ValidUTF8Tests {
    @Test("String(validUTF8:) answers what String(validating:as:) answers, for valid text and every kind of invalid sequence")
    func agreesWithStandardLibrary() {
        var generator = SystemRandomNumberGenerator()
        // Pieces that are valid alone, and sequences that are not: a stray continuation, a truncated lead (one the length of its replacement), overlong forms,
        // a surrogate, a code point past U+10FFFF, bytes that never appear in UTF-8, and the replacement character itself.
        let pieces: [[UInt8]] = [[0x41], [0x00], [0x7f], [0xc3, 0xa9], [0xe4, 0xb8, 0xad], [0xf0, 0x9f, 0x98, 0x80], [0xef, 0xbf, 0xbd],
                                 [0x80], [0xc3], [0xe4, 0xb8], [0xc0, 0x80], [0xe0, 0x80, 0x80], [0xf0, 0x80, 0x80, 0x80],
                                 [0xed, 0xa0, 0x80], [0xf4, 0x90, 0x80, 0x80], [0xfe], [0xff], [0xf8, 0x88, 0x80, 0x80, 0x80], [0xf0, 0x9f, 0x98]]
        var invalid = 0
        for _ in 0..<20_000 {
            let bytes = (0..<Int.random(in: 0...12, using: &generator)).flatMap { _ in pieces.randomElement(using: &generator)! }
            let expected = bytes.withUnsafeBufferPointer { String(validating: $0, as: UTF8.self) }
            let actual = bytes.withUnsafeBufferPointer { String(validUTF8: $0) }
            #expect(actual == expected, "\(bytes)")
            if expected == nil { invalid += 1 }
        }
        #expect(invalid > 5_000 && invalid < 19_000)
        let long = Array(String(repeating: "é😀a", count: 100).utf8)
        #expect(long.withUnsafeBufferPointer { String(validUTF8: $0) } == String(repeating: "é😀a", count: 100))
        #expect((long + [0x80]).withUnsafeBufferPointer { String(validUTF8: $0) } == nil)
    }
}

@Suite("Byte arrays compared by memcmp")
struct SameBytesTests {
    @Test("hasSameBytes(as:) answers what == answers: empty arrays, one byte changed anywhere, different lengths, shared prefixes, slices")
    func agreesWithEquality() {
        var generator = SystemRandomNumberGenerator()
        var equal = 0
        for _ in 0..<20_000 {
            let a = (0..<Int.random(in: 0...40, using: &generator)).map { _ in UInt8.random(in: 0...3, using: &generator) }
            var b = a
            switch Int.random(in: 0..<4, using: &generator) {
            case 0: break
            case 1 where !b.isEmpty: b[Int.random(in: 0..<b.count, using: &generator)] ^= UInt8.random(in: 0...3, using: &generator)
            case 2: b.append(UInt8.random(in: 0...3, using: &generator))
            default: b = Array(b.dropLast())
            }
            #expect(a.hasSameBytes(as: b) == (a == b), "\(a) \(b)")
            #expect(b.hasSameBytes(as: a) == (a == b))
            // Slices of a larger array (what a JWS's header segment is), and a collection without contiguous storage.
            let framed = [9] + b + [9]
            #expect(framed[1..<(framed.count - 1)].hasSameBytes(as: a) == (a == b))
            #expect(a.hasSameBytes(as: b.lazy.map { $0 }) == (a == b))
            if a == b { equal += 1 }
        }
        #expect(equal > 5_000 && equal < 15_000)
        #expect([UInt8]().hasSameBytes(as: []))
        #expect(![UInt8]().hasSameBytes(as: [0]))
    }
}

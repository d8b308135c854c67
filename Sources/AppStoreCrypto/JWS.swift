import AppStoreModels
import Foundation

/// A compact JWS as Apple signs StoreKit 2 data: `base64url(header).base64url(payload).base64url(signature)`,
/// header `{"alg":"ES256","x5c":[leaf, intermediate, root]}` (standard Base64 DER), signature raw R‖S.
public struct JWS: Sendable {
    /// The header's JSON.
    public let header: JSONValue
    /// The header bytes (UTF-8 JSON) as signed.
    public let headerBytes: [UInt8]
    /// The payload bytes (UTF-8 JSON).
    public let payload: [UInt8]
    /// `header.payload` as sent: what the signature covers.
    public let signingInput: [UInt8]
    public let signature: [UInt8]
    /// Where the header's Base64url ends in `signingInput` (its first dot).
    private let headerEnd: Int

    /// The header as sent (Base64url), a slice of `signingInput`: no copy.
    public var encodedHeader: ArraySlice<UInt8> { signingInput[..<headerEnd] }

    /// Splits and decodes a compact JWS; throws `invalid_jws_format` unless it has three Base64url
    /// parts with a JSON object header.
    public init(compact: String) throws {
        var text = compact
        self = try text.withUTF8 { try JWS(compactUTF8: $0) }
    }

    /// The same from the compact form's UTF-8 bytes. The parts are found and decoded on bytes: a notification
    /// is kilobytes of ASCII, and splitting it as Characters cost more than verifying its signature.
    public init(compactUTF8 bytes: UnsafeBufferPointer<UInt8>) throws {
        guard bytes.count <= JWS.maximumCompactLength else {
            throw CryptoError("invalid_jws_format", "a JWS is at most \(JWS.maximumCompactLength) bytes")
        }
        guard let (first, second) = JWS.dots(in: bytes) else {
            throw CryptoError("invalid_jws_format", "a JWS has three dot-separated parts")
        }
        // Base64url is 4/3 of the bytes: an oversized header is refused before it is decoded.
        guard first <= (JWS.maximumHeaderLength * 4 + 2) / 3 else {
            throw CryptoError("invalid_jws_format", "a JWS header is at most \(JWS.maximumHeaderLength) bytes")
        }
        guard let headerBytes = Base64URL.decode(UnsafeBufferPointer(rebasing: bytes[..<first])),
              let payload = Base64URL.decode(UnsafeBufferPointer(rebasing: bytes[(first + 1)..<second])),
              let signature = Base64URL.decode(UnsafeBufferPointer(rebasing: bytes[(second + 1)...])) else {
            throw CryptoError("invalid_jws_format", "a JWS part is not Base64url")
        }
        guard let header = try? JSONValue.parse(headerBytes), header.isObject else {
            throw CryptoError("invalid_jws_format", "the JWS header is not a JSON object")
        }
        self.header = header
        self.headerBytes = headerBytes
        self.payload = payload
        self.signature = signature
        signingInput = Array(bytes[..<second])
        headerEnd = first
    }

    /// Where the two dots of a compact JWS are; nil unless there are exactly two. Found with `memchr`: a notification
    /// is kilobytes, and a byte-by-byte search cost more than the rest of its parse.
    public static func dots(in bytes: UnsafeBufferPointer<UInt8>) -> (first: Int, second: Int)? {
        guard let base = bytes.baseAddress else { return nil }
        func dot(from start: Int) -> Int? {
            guard start < bytes.count, let found = memchr(base + start, Int32(UInt8(ascii: ".")), bytes.count - start) else { return nil }
            return UnsafeRawPointer(found) - UnsafeRawPointer(base)
        }
        guard let first = dot(from: 0), let second = dot(from: first + 1), dot(from: second + 1) == nil else { return nil }
        return (first, second)
    }

    /// The payload as JSON.
    public func payloadJSON() throws -> JSONValue {
        do { return try JSONValue.parse(payload) } catch { throw CryptoError("invalid_jws_format", "the JWS payload is not JSON: \(error)") }
    }

    /// The largest compact JWS accepted: Apple's signed notifications, which nest a signed transaction
    /// and renewal info with their chains, are about 16 KiB.
    public static let maximumCompactLength = 256 * 1024
    /// The largest header accepted: three certificates in Base64 are about 4 KiB.
    public static let maximumHeaderLength = 16 * 1024
    /// Apple's chains: leaf, intermediate, root.
    public static let chainLength = 3

    /// The certificates of the `x5c` header, leaf first. The entries are counted before any is
    /// parsed: anything but Apple's three is refused with `invalid_chain_length`.
    public func certificates() throws -> [Certificate] {
        guard let list = header["x5c"]?.array else { throw CryptoError("invalid_certificate", "the JWS header has no x5c chain") }
        guard list.count == JWS.chainLength else {
            throw CryptoError("invalid_chain_length", "x5c must hold exactly \(JWS.chainLength) certificates, it holds \(list.count)")
        }
        return try list.map { entry in
            guard let text = entry.text else { throw CryptoError("invalid_certificate", "an x5c entry is not Base64 DER") }
            return try Self.certificate(x5c: text)
        }
    }

    /// One `x5c` entry's certificate. The entry must be its DER in standard Base64 exactly as it encodes (RFC 7515
    /// §4.1.6), and the DER exact: a certificate has one spelling here, so a cache keyed by the entries' text holds one
    /// entry per certificate, however a sender spells it.
    public static func certificate(x5c text: String) throws -> Certificate {
        guard let decoded = Data(base64Encoded: text) else { throw CryptoError("invalid_certificate", "an x5c entry is not Base64 DER") }
        guard decoded.base64EncodedString() == text else {
            throw CryptoError("invalid_certificate", "an x5c entry is not in standard Base64 as its bytes encode")
        }
        return try Certificate(exactDER: [UInt8](decoded))
    }

    /// Verifies the way Apple's `SignedDataVerifier` does: `alg` ES256, exactly three x5c certificates,
    /// leaf → intermediate → one of the verifier's roots at `date` (x5c[2] itself is not trusted), the
    /// leaf and intermediate marker OIDs, then the signature with the leaf's key. Returns the leaf.
    @discardableResult
    public func verify(with verifier: ChainVerifier, at date: Date) throws -> Certificate {
        let chain = try verifyChain(with: verifier, at: date)
        guard let key = chain[0].publicKey, key.isValidES256(signature, for: signingInput) else {
            throw CryptoError("signature_mismatch", "the JWS signature does not verify with the leaf certificate's key")
        }
        return chain[0]
    }

    /// The chain half of `verify`: `alg` ES256, three x5c certificates, leaf → intermediate → a root at `date`
    /// with Apple's OIDs. Returns the chain (leaf first); the signature is not checked.
    public func verifyChain(with verifier: ChainVerifier, at date: Date) throws -> [Certificate] {
        guard header["alg"]?.text == "ES256" else { throw CryptoError("invalid_jws_algorithm", "JWS alg must be ES256") }
        let chain = try certificates()
        try verifier.verify(leaf: chain[0], intermediates: [chain[1]], at: date, policy: .appleReceiptSigning)
        return chain
    }

    /// Signs `payload` (JSON bytes) with `key`, putting `chain` (leaf first) in `x5c`, or `keyId` in `kid`
    /// for tokens (`typ` JWT) such as App Store Server API bearer tokens.
    public static func sign(payload: [UInt8], key: PrivateKey, chain: [Certificate] = [], keyId: String? = nil) throws -> String {
        var header = JSONBuffer(capacity: 4096)
        header.object { json in
            json.field("alg", "ES256")
            if let keyId {
                json.field("kid", keyId)
                json.field("typ", "JWT")
            }
            if !chain.isEmpty {
                json.key("x5c")
                json.array(chain) { json, certificate in json.string(Data(certificate.der).base64EncodedString()) }
            }
        }
        let input = Base64URL.encode(header.bytes) + "." + Base64URL.encode(payload)
        let signature = try key.signES256(Array(input.utf8))
        return input + "." + Base64URL.encode(signature)
    }
}

/// Four Base64 digit values (each below 64) written as their three bytes: the fast path of both decoders.
enum Base64Group {
    @inline(__always)
    static func write(_ a: UInt8, _ b: UInt8, _ c: UInt8, _ d: UInt8, into output: inout UnsafeMutableBufferPointer<UInt8>, at offset: Int) {
        let value = UInt32(a) << 18 | UInt32(b) << 12 | UInt32(c) << 6 | UInt32(d)
        output[offset] = UInt8(truncatingIfNeeded: value >> 16)
        output[offset + 1] = UInt8(truncatingIfNeeded: value >> 8)
        output[offset + 2] = UInt8(truncatingIfNeeded: value)
    }
}

/// Base64url without padding (RFC 7515 §2).
public enum Base64URL {
    /// Base64url without padding, written straight into the string's storage (every JWS the emulator signs has three
    /// parts; replacing characters in a Foundation string cost more than the signature).
    public static func encode(_ bytes: some Collection<UInt8>) -> String {
        let input = bytes as? [UInt8] ?? Array(bytes)
        let length = input.count / 3 * 4 + [0, 2, 3][input.count % 3]
        guard length > 0 else { return "" }
        return input.withUnsafeBufferPointer { input in
            alphabet.withUnsafeBufferPointer { alphabet in
                String(unsafeUninitializedCapacity: length) { output in
                    var read = 0, written = 0
                    while read + 3 <= input.count {
                        let value = UInt32(input[read]) << 16 | UInt32(input[read + 1]) << 8 | UInt32(input[read + 2])
                        output[written] = alphabet[Int(value >> 18 & 63)]
                        output[written + 1] = alphabet[Int(value >> 12 & 63)]
                        output[written + 2] = alphabet[Int(value >> 6 & 63)]
                        output[written + 3] = alphabet[Int(value & 63)]
                        read += 3
                        written += 4
                    }
                    switch input.count - read {
                    case 1:
                        let value = UInt32(input[read]) << 16
                        output[written] = alphabet[Int(value >> 18 & 63)]
                        output[written + 1] = alphabet[Int(value >> 12 & 63)]
                        written += 2
                    case 2:
                        let value = UInt32(input[read]) << 16 | UInt32(input[read + 1]) << 8
                        output[written] = alphabet[Int(value >> 18 & 63)]
                        output[written + 1] = alphabet[Int(value >> 12 & 63)]
                        output[written + 2] = alphabet[Int(value >> 6 & 63)]
                        written += 3
                    default: break
                    }
                    return written
                }
            }
        }
    }

    private static let alphabet: [UInt8] = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)

    /// Which two characters stand for 62 and 63.
    public enum Alphabet: Sendable {
        /// `-` and `_` (RFC 4648 §5): JWS.
        case url
        /// `+` and `/` (RFC 4648 §4), here without its padding.
        case standard
    }

    public static func decode(_ text: some StringProtocol, alphabet: Alphabet = .url) -> [UInt8]? {
        if let decoded = text.utf8.withContiguousStorageIfAvailable({ decode($0, alphabet: alphabet) }) { return decoded }
        return Array(text.utf8).withUnsafeBufferPointer { decode($0, alphabet: alphabet) }
    }

    /// Decodes unpadded Base64 in one alphabet, four characters into three bytes at a time, straight into the array's
    /// storage. Only the canonical spelling is accepted: characters of the other alphabet, and a last character whose
    /// unused low bits are not zero, are refused, so one value has one text (a JWS cannot be re-spelt into another that
    /// verifies).
    public static func decode(_ input: UnsafeBufferPointer<UInt8>, alphabet: Alphabet = .url) -> [UInt8]? {
        guard input.count % 4 != 1 else { return nil }
        let length = input.count / 4 * 3 + [0, 0, 1, 2][input.count % 4]
        var valid = true
        let output = (alphabet == .url ? urlTable : standardTable).withUnsafeBufferPointer { table in
            [UInt8](unsafeUninitializedCapacity: length) { output, initialized in
                var read = 0, written = 0
                while read + 4 <= input.count {
                    let a = table[Int(input[read])], b = table[Int(input[read + 1])], c = table[Int(input[read + 2])], d = table[Int(input[read + 3])]
                    guard (a | b | c | d) < 64 else { valid = false; break }
                    Base64Group.write(a, b, c, d, into: &output, at: written)
                    read += 4
                    written += 3
                }
                if valid, read < input.count {
                    // Two or three characters left: one or two bytes, the bits past them zero.
                    var value: UInt32 = 0
                    for index in read..<input.count {
                        let digit = table[Int(input[index])]
                        guard digit < 64 else { valid = false; break }
                        value = value << 6 | UInt32(digit)
                    }
                    let unused: UInt32 = input.count - read == 2 ? 0x0f : 0x03
                    if value & unused != 0 { valid = false }
                    if valid {
                        value <<= UInt32(6 * (4 - (input.count - read)))
                        output[written] = UInt8(truncatingIfNeeded: value >> 16)
                        written += 1
                        if input.count - read == 3 {
                            output[written] = UInt8(truncatingIfNeeded: value >> 8)
                            written += 1
                        }
                    }
                }
                initialized = valid ? written : 0
            }
        }
        return valid ? output : nil
    }

    /// Digit values of each alphabet; 255 for anything else (padding included: JWS has none).
    private static let urlTable = digitTable(sixtyTwo: "-", sixtyThree: "_")
    private static let standardTable = digitTable(sixtyTwo: "+", sixtyThree: "/")

    private static func digitTable(sixtyTwo: Unicode.Scalar, sixtyThree: Unicode.Scalar) -> [UInt8] {
        var table = [UInt8](repeating: 255, count: 256)
        for (index, character) in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789".utf8.enumerated() { table[Int(character)] = UInt8(index) }
        table[Int(sixtyTwo.value)] = 62
        table[Int(sixtyThree.value)] = 63
        return table
    }
}

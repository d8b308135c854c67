/// A failure to read BER/DER; the message names what was wrong, never the bytes.
public struct ASN1Error: Error, Sendable, CustomStringConvertible, Equatable {
    public let description: String
    init(_ description: String) { self.description = description }
}

/// One BER/DER element: its identifier octet, its content, and (for constructed types) its children.
/// Reads definite and indefinite lengths, so Xcode's BER receipts parse as well as Apple's DER.
public struct ASN1Element: Sendable {
    /// The identifier octet (class, constructed bit, tag number < 31).
    public let tag: UInt8
    /// The whole encoding (identifier, length, content and end-of-contents if any).
    public let encoded: ArraySlice<UInt8>
    /// The content octets (excluding the end-of-contents marker of indefinite lengths).
    public let content: ArraySlice<UInt8>
    /// How many constructed elements enclose this one in the parse that produced it; children
    /// are read one level deeper, so no chain of `children()` or `octets()` calls can exceed
    /// `maximumDepth`, whatever the input nests.
    public let depth: Int

    /// The deepest nesting accepted. Apple's receipts and certificates nest about 14 levels
    /// (Xcode's double-wrapped BER payload included); anything deeper is hostile.
    public static let maximumDepth = 32

    /// Whether the constructed bit is set.
    public var isConstructed: Bool { tag & 0x20 != 0 }

    /// Parses exactly one element from `bytes`; trailing bytes are an error.
    public static func parse(_ bytes: [UInt8]) throws -> ASN1Element {
        let (element, rest) = try parsePrefix(bytes[...])
        guard rest.isEmpty else { throw ASN1Error("trailing bytes after the outer element") }
        return element
    }

    /// Parses one element at the start of `bytes` and returns it with the remaining bytes.
    public static func parsePrefix(_ bytes: ArraySlice<UInt8>, depth: Int = 0) throws -> (ASN1Element, ArraySlice<UInt8>) {
        guard depth < maximumDepth else { throw ASN1Error("nesting too deep") }
        var index = bytes.startIndex
        guard index < bytes.endIndex else { throw ASN1Error("unexpected end of data") }
        let tag = bytes[index]
        guard tag & 0x1f != 0x1f else { throw ASN1Error("multi-byte tags are not supported") }
        index += 1
        guard index < bytes.endIndex else { throw ASN1Error("missing length") }
        let first = bytes[index]
        index += 1
        if first == 0x80 {
            guard tag & 0x20 != 0 else { throw ASN1Error("indefinite length on a primitive element") }
            let contentStart = index
            var cursor = bytes[index...]
            while true {
                guard cursor.count >= 2 else { throw ASN1Error("missing end-of-contents") }
                if cursor[cursor.startIndex] == 0, cursor[cursor.startIndex + 1] == 0 {
                    let contentEnd = cursor.startIndex
                    let end = contentEnd + 2
                    return (ASN1Element(tag: tag, encoded: bytes[bytes.startIndex..<end], content: bytes[contentStart..<contentEnd], depth: depth), bytes[end...])
                }
                let (_, rest) = try parsePrefix(cursor, depth: depth + 1)
                cursor = rest
            }
        }
        var length = 0
        if first & 0x80 == 0 {
            length = Int(first)
        } else {
            let count = Int(first & 0x7f)
            guard count <= 4 else { throw ASN1Error("length too large") }
            guard bytes.endIndex - index >= count else { throw ASN1Error("truncated length") }
            for _ in 0..<count {
                length = (length << 8) | Int(bytes[index])
                index += 1
            }
        }
        guard bytes.endIndex - index >= length else { throw ASN1Error("truncated content") }
        let end = index + length
        return (ASN1Element(tag: tag, encoded: bytes[bytes.startIndex..<end], content: bytes[index..<end], depth: depth), bytes[end...])
    }

    /// The child elements of a constructed element.
    public func children() throws -> [ASN1Element] {
        guard isConstructed else { throw ASN1Error("primitive element has no children") }
        var result: [ASN1Element] = []
        var rest = content
        while !rest.isEmpty {
            let (child, remaining) = try ASN1Element.parsePrefix(rest, depth: depth + 1)
            result.append(child)
            rest = remaining
        }
        return result
    }

    /// Children, checking this element's tag first.
    public func children(expecting expected: UInt8, _ what: String) throws -> [ASN1Element] {
        guard tag == expected else { throw ASN1Error("\(what): unexpected tag") }
        return try children()
    }

    /// The value of an OCTET STRING, concatenating the segments of a constructed (BER) one.
    public func octets() throws -> [UInt8] {
        if tag == 0x04 { return Array(content) }
        if tag == 0x24 { return try children().flatMap { try $0.octets() } }
        throw ASN1Error("expected an OCTET STRING")
    }

    /// A non-negative INTEGER that fits in 63 bits.
    public func integer() throws -> Int64 {
        guard tag == 0x02, !content.isEmpty else { throw ASN1Error("expected an INTEGER") }
        guard content.first! & 0x80 == 0 else { throw ASN1Error("negative INTEGER") }
        var digits = content.drop { $0 == 0 }
        if digits.isEmpty { return 0 }
        guard digits.count <= 8 else { throw ASN1Error("INTEGER too large") }
        var value: UInt64 = 0
        for byte in digits { value = (value << 8) | UInt64(byte) }
        digits = []
        guard value <= UInt64(Int64.max) else { throw ASN1Error("INTEGER too large") }
        return Int64(value)
    }

    /// Whether `tag` is one of the string types `string()` reads (UTF8String, IA5String, PrintableString, …).
    public static func isString(tag: UInt8) -> Bool {
        switch tag {
        case 0x0c, 0x16, 0x13, 0x14, 0x1a, 0x1e, 0x12: true
        default: false
        }
    }

    /// The text of a UTF8String, IA5String, PrintableString or similar.
    public func string() throws -> String {
        guard Self.isString(tag: tag) else { throw ASN1Error("expected a string") }
        guard let text = String(validUTF8: content) else { throw ASN1Error("string is not UTF-8") }
        return text
    }

    /// The dotted form of an OBJECT IDENTIFIER.
    public func objectIdentifier() throws -> String {
        guard tag == 0x06, !content.isEmpty else { throw ASN1Error("expected an OBJECT IDENTIFIER") }
        // Written as it is read (every receipt's signature names several): no arrays of arcs, no joining.
        var text = ""
        text.reserveCapacity(content.count * 3)
        var value: UInt64 = 0
        var first = true
        var arcStarts = true
        for byte in content {
            // DER: each arc in as few bytes as it takes (no leading 0x80), and no arc past 64 bits, so one identifier
            // has one encoding.
            guard !(arcStarts && byte == 0x80), value >> 57 == 0 else { throw ASN1Error("malformed OBJECT IDENTIFIER") }
            value = (value << 7) | UInt64(byte & 0x7f)
            arcStarts = byte & 0x80 == 0
            guard byte & 0x80 == 0 else { continue }
            if first {
                let (top, second) = value < 40 ? (0, value) : value < 80 ? (1, value - 40) : (2, value - 80)
                text += String(top)
                text += "."
                text += String(second)
                first = false
            } else {
                text += "."
                text += String(value)
            }
            value = 0
        }
        guard !first else { throw ASN1Error("empty OBJECT IDENTIFIER") }
        guard arcStarts else { throw ASN1Error("malformed OBJECT IDENTIFIER: its last arc is cut short") }
        return text
    }
}

/// DER encoding helpers.
public enum DER {
    /// Identifier octets used by receipts and CMS.
    public enum Tag {
        public static let integer: UInt8 = 0x02
        public static let octetString: UInt8 = 0x04
        public static let null: UInt8 = 0x05
        public static let objectIdentifier: UInt8 = 0x06
        public static let utf8String: UInt8 = 0x0c
        public static let ia5String: UInt8 = 0x16
        public static let sequence: UInt8 = 0x30
        public static let set: UInt8 = 0x31
    }

    /// Identifier, definite length and content.
    public static func tlv(_ tag: UInt8, _ content: [UInt8]) -> [UInt8] {
        var out: [UInt8] = [tag]
        out.reserveCapacity(content.count + 6)
        appendLength(content.count, to: &out)
        out.append(contentsOf: content)
        return out
    }

    static func appendLength(_ length: Int, to out: inout [UInt8]) {
        if length < 0x80 {
            out.append(UInt8(length))
        } else {
            var bytes: [UInt8] = []
            var value = length
            while value > 0 {
                bytes.insert(UInt8(value & 0xff), at: 0)
                value >>= 8
            }
            out.append(0x80 | UInt8(bytes.count))
            out.append(contentsOf: bytes)
        }
    }

    /// A SEQUENCE of already encoded elements.
    public static func sequence(_ elements: [[UInt8]]) -> [UInt8] { tlv(Tag.sequence, elements.flatMap { $0 }) }

    /// A SET OF, sorted by encoding as DER requires.
    public static func setOf(_ elements: [[UInt8]]) -> [UInt8] {
        tlv(Tag.set, elements.sorted { $0.lexicographicallyPrecedes($1) }.flatMap { $0 })
    }

    /// An INTEGER in two's complement, shortest form (negative values too: nothing a setting holds traps here).
    public static func integer(_ value: Int64) -> [UInt8] {
        var bytes = withUnsafeBytes(of: value.bigEndian) { Array($0) }
        // Drop leading bytes that only repeat the sign.
        while bytes.count > 1, (bytes[0] == 0 && bytes[1] & 0x80 == 0) || (bytes[0] == 0xff && bytes[1] & 0x80 != 0) {
            bytes.removeFirst()
        }
        return tlv(Tag.integer, bytes)
    }

    /// An INTEGER from unsigned big-endian bytes (serial numbers).
    public static func unsignedInteger(_ bytes: [UInt8]) -> [UInt8] {
        var digits = Array(bytes.drop { $0 == 0 })
        if digits.isEmpty { digits = [0] }
        if digits[0] & 0x80 != 0 { digits.insert(0, at: 0) }
        return tlv(Tag.integer, digits)
    }

    /// An OCTET STRING.
    public static func octetString(_ bytes: [UInt8]) -> [UInt8] { tlv(Tag.octetString, bytes) }
    /// A UTF8String.
    public static func utf8String(_ text: String) -> [UInt8] { tlv(Tag.utf8String, Array(text.utf8)) }
    /// An IA5String.
    public static func ia5String(_ text: String) -> [UInt8] { tlv(Tag.ia5String, Array(text.utf8)) }
    /// NULL.
    public static let null: [UInt8] = [0x05, 0x00]

    /// An OBJECT IDENTIFIER from its dotted form.
    public static func objectIdentifier(_ dotted: String) -> [UInt8] {
        let parts = dotted.split(separator: ".").compactMap { UInt64($0) }
        precondition(parts.count >= 2, "an OID has at least two arcs")
        var content: [UInt8] = []
        for (index, arc) in ([parts[0] * 40 + parts[1]] + parts.dropFirst(2)).enumerated() {
            _ = index
            var chunk: [UInt8] = [UInt8(arc & 0x7f)]
            var value = arc >> 7
            while value > 0 {
                chunk.insert(UInt8(value & 0x7f) | 0x80, at: 0)
                value >>= 7
            }
            content.append(contentsOf: chunk)
        }
        return tlv(Tag.objectIdentifier, content)
    }

    /// A context-specific constructed tag `[n]` around encoded content.
    public static func explicit(_ number: UInt8, _ content: [UInt8]) -> [UInt8] { tlv(0xa0 | number, content) }
}

/// Object identifiers used by receipts and Apple's certificates.
public enum OID {
    public static let signedData = "1.2.840.113549.1.7.2"
    public static let data = "1.2.840.113549.1.7.1"
    public static let sha1 = "1.3.14.3.2.26"
    public static let sha256 = "2.16.840.1.101.3.4.2.1"
    public static let rsaEncryption = "1.2.840.113549.1.1.1"
    public static let sha1WithRSA = "1.2.840.113549.1.1.5"
    public static let sha256WithRSA = "1.2.840.113549.1.1.11"
    public static let messageDigest = "1.2.840.113549.1.9.4"
    /// Apple's marker on the WWDR intermediate certificate.
    public static let appleWWDRIntermediate = "1.2.840.113635.100.6.2.1"
    /// Apple's marker on the receipt-signing leaf certificate.
    public static let appleReceiptSigner = "1.2.840.113635.100.6.11.1"
    /// Apple's marker on the iTunes Store certificate that signed iOS 6 transaction receipts.
    public static let appleTransactionReceiptSigner = "1.2.840.113635.100.6.5.1"
}

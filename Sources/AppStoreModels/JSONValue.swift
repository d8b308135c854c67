/// A parsed JSON document, for the hot paths where Foundation's JSONDecoder costs more than the
/// work around it (every verifyReceipt answer is read once per verification).
public enum JSONValue: Sendable, Equatable {
    case null
    case bool(Bool)
    /// The number's text as written (`12`, `-1.5e3`): verifyReceipt mixes numbers and numeric strings.
    case number(String)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

    /// Parses a complete JSON text (RFC 8259); throws on anything else, including trailing bytes.
    public static func parse<Bytes: Collection<UInt8>>(_ bytes: Bytes) throws(JSONParseError) -> JSONValue {
        // Read in place where the bytes are contiguous (an array, or a request body's Data): a verifyReceipt body is half
        // a megabyte, and copying it cost as much as a tenth of its parsing.
        if let parsed = bytes.withContiguousStorageIfAvailable({ buffer in Result { () throws(JSONParseError) in try parse(buffer: buffer) } }) {
            return try parsed.get()
        }
        return try Array(bytes).withUnsafeBufferPointer { buffer throws(JSONParseError) -> JSONValue in try parse(buffer: buffer) }
    }

    private static func parse(buffer: UnsafeBufferPointer<UInt8>) throws(JSONParseError) -> JSONValue {
        var parser = JSONParser(bytes: buffer)
        let value = try parser.value(depth: 0)
        parser.skipSpace()
        guard parser.offset == buffer.count else { throw parser.error("unexpected bytes after the JSON value") }
        return value
    }

    public subscript(key: String) -> JSONValue? {
        if case .object(let fields) = self { return fields[key] }
        return nil
    }

    /// A string, or a number's text (verifyReceipt writes some ids either way).
    public var text: String? {
        switch self {
        case .string(let value), .number(let value): return value
        default: return nil
        }
    }

    /// An integer from a number or a numeric string.
    public var int64: Int64? { text.flatMap { Int64($0) } }

    public var bool: Bool? {
        switch self {
        case .bool(let value): return value
        case .number(let text): return Int(text).map { $0 != 0 }
        case .string(let text): return text == "true" ? true : text == "false" ? false : nil
        default: return nil
        }
    }

    public var array: [JSONValue]? {
        if case .array(let values) = self { return values }
        return nil
    }

    public var isObject: Bool {
        if case .object = self { return true }
        return false
    }
}

/// Where and why a JSON text could not be parsed.
public struct JSONParseError: Error, Sendable, Equatable, CustomStringConvertible {
    public let offset: Int
    public let message: String
    public var description: String { "invalid JSON at byte \(offset): \(message)" }
}

private struct JSONParser {
    let bytes: UnsafeBufferPointer<UInt8>
    var offset = 0
    static let maxDepth = 128

    init(bytes: UnsafeBufferPointer<UInt8>) { self.bytes = bytes }

    func error(_ message: String) -> JSONParseError { JSONParseError(offset: offset, message: message) }

    mutating func skipSpace() {
        while offset < bytes.count {
            switch bytes[offset] {
            case 0x20, 0x09, 0x0a, 0x0d: offset += 1
            default: return
            }
        }
    }

    mutating func value(depth: Int) throws(JSONParseError) -> JSONValue {
        guard depth < Self.maxDepth else { throw error("nested deeper than \(Self.maxDepth) levels") }
        skipSpace()
        guard offset < bytes.count else { throw error("unexpected end of input") }
        switch bytes[offset] {
        case UInt8(ascii: "{"): return try object(depth: depth)
        case UInt8(ascii: "["): return try array(depth: depth)
        case UInt8(ascii: "\""): return .string(try string())
        case UInt8(ascii: "t"): try literal("true"); return .bool(true)
        case UInt8(ascii: "f"): try literal("false"); return .bool(false)
        case UInt8(ascii: "n"): try literal("null"); return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return .number(try number())
        default: throw error("unexpected character")
        }
    }

    mutating func literal(_ word: StaticString) throws(JSONParseError) {
        let count = word.utf8CodeUnitCount
        guard offset + count <= bytes.count else { throw error("unexpected end of input") }
        for index in 0..<count where bytes[offset + index] != word.utf8Start[index] { throw error("unexpected character") }
        offset += count
    }

    mutating func object(depth: Int) throws(JSONParseError) -> JSONValue {
        offset += 1
        var fields: [String: JSONValue] = [:]
        skipSpace()
        if offset < bytes.count, bytes[offset] == UInt8(ascii: "}") {
            offset += 1
            return .object(fields)
        }
        while true {
            skipSpace()
            guard offset < bytes.count, bytes[offset] == UInt8(ascii: "\"") else { throw error("expected a key") }
            let key = try string()
            skipSpace()
            guard offset < bytes.count, bytes[offset] == UInt8(ascii: ":") else { throw error("expected ':'") }
            offset += 1
            fields[key] = try value(depth: depth + 1)
            skipSpace()
            guard offset < bytes.count else { throw error("unexpected end of input") }
            if bytes[offset] == UInt8(ascii: ",") { offset += 1; continue }
            if bytes[offset] == UInt8(ascii: "}") { offset += 1; return .object(fields) }
            throw error("expected ',' or '}'")
        }
    }

    mutating func array(depth: Int) throws(JSONParseError) -> JSONValue {
        offset += 1
        var values: [JSONValue] = []
        skipSpace()
        if offset < bytes.count, bytes[offset] == UInt8(ascii: "]") {
            offset += 1
            return .array(values)
        }
        while true {
            values.append(try value(depth: depth + 1))
            skipSpace()
            guard offset < bytes.count else { throw error("unexpected end of input") }
            if bytes[offset] == UInt8(ascii: ",") { offset += 1; continue }
            if bytes[offset] == UInt8(ascii: "]") { offset += 1; return .array(values) }
            throw error("expected ',' or ']'")
        }
    }

    mutating func number() throws(JSONParseError) -> String {
        let start = offset
        if bytes[offset] == UInt8(ascii: "-") { offset += 1 }
        func digits(_ parser: inout JSONParser) -> Int {
            let from = parser.offset
            while parser.offset < parser.bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(parser.bytes[parser.offset]) { parser.offset += 1 }
            return parser.offset - from
        }
        let integer = digits(&self)
        guard integer > 0 else { throw error("expected digits") }
        if integer > 1 && bytes[offset - integer] == UInt8(ascii: "0") { throw error("leading zero") }
        if offset < bytes.count, bytes[offset] == UInt8(ascii: ".") {
            offset += 1
            guard digits(&self) > 0 else { throw error("expected digits after '.'") }
        }
        if offset < bytes.count, bytes[offset] == UInt8(ascii: "e") || bytes[offset] == UInt8(ascii: "E") {
            offset += 1
            if offset < bytes.count, bytes[offset] == UInt8(ascii: "+") || bytes[offset] == UInt8(ascii: "-") { offset += 1 }
            guard digits(&self) > 0 else { throw error("expected exponent digits") }
        }
        return String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<offset]), as: UTF8.self)
    }

    mutating func string() throws(JSONParseError) -> String {
        offset += 1
        let start = offset
        // Fast path: no escapes. Eight bytes at a time while none of them is a quote, a backslash or a control
        // character (signed payloads and receipts are strings of kilobytes), then byte by byte.
        if let base = bytes.baseAddress {
            while offset + 8 <= bytes.count {
                let word = UnsafeRawPointer(base + offset).loadUnaligned(as: UInt64.self)
                guard !JSONBytes.holdsSpecialByte(word) else { break }
                offset += 8
            }
        }
        while offset < bytes.count {
            let byte = bytes[offset]
            if byte == UInt8(ascii: "\"") {
                let text = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<offset]), as: UTF8.self)
                offset += 1
                return text
            }
            if byte == UInt8(ascii: "\\") { break }
            if byte < 0x20 { throw error("control character in a string") }
            offset += 1
        }
        var out = Array(bytes[start..<offset])
        while offset < bytes.count {
            let byte = bytes[offset]
            offset += 1
            switch byte {
            case UInt8(ascii: "\""):
                return String(decoding: out, as: UTF8.self)
            case UInt8(ascii: "\\"):
                guard offset < bytes.count else { throw error("unexpected end of input") }
                let escape = bytes[offset]
                offset += 1
                switch escape {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): out.append(escape)
                case UInt8(ascii: "b"): out.append(0x08)
                case UInt8(ascii: "f"): out.append(0x0c)
                case UInt8(ascii: "n"): out.append(0x0a)
                case UInt8(ascii: "r"): out.append(0x0d)
                case UInt8(ascii: "t"): out.append(0x09)
                case UInt8(ascii: "u"):
                    var scalar = try hex4()
                    if (0xD800...0xDBFF).contains(scalar) {
                        guard offset + 1 < bytes.count, bytes[offset] == UInt8(ascii: "\\"), bytes[offset + 1] == UInt8(ascii: "u") else {
                            throw error("unpaired surrogate")
                        }
                        offset += 2
                        let low = try hex4()
                        guard (0xDC00...0xDFFF).contains(low) else { throw error("unpaired surrogate") }
                        scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                    } else if (0xDC00...0xDFFF).contains(scalar) {
                        throw error("unpaired surrogate")
                    }
                    guard let unicode = Unicode.Scalar(scalar) else { throw error("invalid \\u escape") }
                    out.append(contentsOf: Array(String(Character(unicode)).utf8))
                default:
                    throw error("invalid escape")
                }
            default:
                if byte < 0x20 { throw error("control character in a string") }
                out.append(byte)
            }
        }
        throw error("unterminated string")
    }

    mutating func hex4() throws(JSONParseError) -> UInt32 {
        guard offset + 4 <= bytes.count else { throw error("unexpected end of input") }
        var value: UInt32 = 0
        for _ in 0..<4 {
            let byte = bytes[offset]
            offset += 1
            let digit: UInt8
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = byte - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = byte - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = byte - UInt8(ascii: "A") + 10
            default: throw error("invalid \\u escape")
            }
            value = value << 4 | UInt32(digit)
        }
        return value
    }
}

/// Byte tests shared by the parser and the writer.
enum JSONBytes {
    /// Whether any byte of `word` is `"`, `\` or below 0x20: a byte that is zero after the XOR, or below 0x20 (the
    /// borrow trick of "Determine if a word has a byte less than n", Sean Anderson's Bit Twiddling Hacks). Exact about
    /// whether one exists, which is all the callers ask.
    @inline(__always)
    static func holdsSpecialByte(_ word: UInt64) -> Bool {
        let ones: UInt64 = 0x0101_0101_0101_0101
        let highs: UInt64 = 0x8080_8080_8080_8080
        let quote = word ^ (ones &* 0x22)
        let backslash = word ^ (ones &* 0x5C)
        let below = ((quote &- ones) & ~quote) | ((backslash &- ones) & ~backslash) | ((word &- ones &* 0x20) & ~word)
        return below & highs != 0
    }

    /// Whether `buffer` holds a byte that a JSON string must escape: eight bytes at a time, then the rest one by one.
    static func needsEscaping(_ buffer: UnsafeBufferPointer<UInt8>) -> Bool {
        var offset = 0
        if let base = buffer.baseAddress {
            while offset + 8 <= buffer.count {
                if holdsSpecialByte(UnsafeRawPointer(base + offset).loadUnaligned(as: UInt64.self)) { return true }
                offset += 8
            }
        }
        while offset < buffer.count {
            let byte = buffer[offset]
            if byte < 0x20 || byte == 34 || byte == 92 { return true }
            offset += 1
        }
        return false
    }
}

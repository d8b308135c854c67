import AppStoreModels

/// One definite-length DER element found by `DERCursor`: its identifier octet and where its encoding and its content lie,
/// as offsets into the buffer read.
struct DERElement {
    var tag: UInt8
    /// Where the identifier octet is (the start of the whole encoding).
    var headerStart: Int
    /// Where the content starts.
    var start: Int
    /// Where the content (and the encoding) ends.
    var end: Int

    init(tag: UInt8, headerStart: Int? = nil, start: Int, end: Int) {
        self.tag = tag
        self.headerStart = headerStart ?? start
        self.start = start
        self.end = end
    }

    var isConstructed: Bool { tag & 0x20 != 0 }
}

/// Reads definite-length DER elements one after another within `[position, end)` of a buffer, with integer offsets, so
/// no slice (and no reference count) is made per element. It is what the fast paths of the receipt's decoders walk
/// with: `next()` answers nil for what it does not read (an indefinite length, a multi-byte tag, a length of four or
/// more bytes, truncation), and the fast path then gives the bytes to the general decoder (`ASN1Element`), which reads
/// every form and names what is wrong. It never decides that bytes are bad.
struct DERCursor {
    let bytes: UnsafeBufferPointer<UInt8>
    private(set) var position: Int
    let end: Int

    init(bytes: UnsafeBufferPointer<UInt8>, position: Int, end: Int) {
        self.bytes = bytes
        self.position = position
        self.end = end
    }

    /// A cursor over the whole buffer.
    init(bytes: UnsafeBufferPointer<UInt8>) { self.init(bytes: bytes, position: 0, end: bytes.count) }

    var isAtEnd: Bool { position >= end }

    /// The next element, or nil where the fast path stops.
    mutating func next() -> DERElement? {
        guard position + 2 <= end else { return nil }
        let tag = bytes[position]
        guard tag & 0x1f != 0x1f else { return nil }
        var length = Int(bytes[position + 1])
        var offset = position + 2
        if length & 0x80 != 0 {
            let count = length & 0x7f
            guard (1...3).contains(count), offset + count <= end else { return nil }
            length = 0
            for index in 0..<count { length = length << 8 | Int(bytes[offset + index]) }
            offset += count
        }
        guard length <= end - offset else { return nil }
        let element = DERElement(tag: tag, headerStart: position, start: offset, end: offset + length)
        position = offset + length
        return element
    }

    /// The next element when it has this tag; nil otherwise.
    mutating func next(tagged tag: UInt8) -> DERElement? {
        guard let element = next(), element.tag == tag else { return nil }
        return element
    }

    /// The elements of a constructed element.
    func children(of element: DERElement) -> DERCursor { DERCursor(bytes: bytes, position: element.start, end: element.end) }

    /// The content of an element, copied.
    func content(of element: DERElement) -> [UInt8] { Array(UnsafeBufferPointer(rebasing: bytes[element.start..<element.end])) }

    /// The whole encoding of an element (identifier, length and content), copied.
    func encoding(of element: DERElement) -> [UInt8] { Array(UnsafeBufferPointer(rebasing: bytes[element.headerStart..<element.end])) }

    /// Whether an element's content is exactly these bytes.
    func content(of element: DERElement, equals expected: [UInt8]) -> Bool {
        expected.hasSameBytes(as: UnsafeBufferPointer(rebasing: bytes[element.start..<element.end]))
    }
}

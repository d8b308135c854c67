import Foundation

extension String {
    /// The text of `bytes` when they are valid UTF-8, nil otherwise: what `String(validating:as:)` answers, without its
    /// generic path, which looks up type metadata at run time on every call (a tenth of the time spent decoding a receipt
    /// of a thousand purchases, which holds four strings per purchase).
    public init?(validUTF8 bytes: UnsafeBufferPointer<UInt8>) {
        let text = String(decoding: bytes, as: UTF8.self)
        // Decoding replaces every invalid sequence with U+FFFD, so its bytes equal the input's exactly when the input was valid.
        let same = text.utf8.withContiguousStorageIfAvailable { decoded in
            decoded.count == bytes.count && (bytes.isEmpty || memcmp(decoded.baseAddress!, bytes.baseAddress!, bytes.count) == 0)
        } ?? text.utf8.elementsEqual(bytes)
        guard same else { return nil }
        self = text
    }

    /// `init?(validUTF8:)` of an array's bytes.
    public init?(validUTF8 bytes: [UInt8]) {
        guard let text = bytes.withUnsafeBufferPointer({ String(validUTF8: $0) }) else { return nil }
        self = text
    }

    /// `init?(validUTF8:)` of a slice's bytes (an ASN.1 element's content).
    public init?(validUTF8 bytes: ArraySlice<UInt8>) {
        guard let text = bytes.withUnsafeBufferPointer({ String(validUTF8: $0) }) else { return nil }
        self = text
    }
}

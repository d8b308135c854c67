import AppStoreCrypto
import Foundation

/// An uploaded app receipt as this server stores it, and back. An App Store receipt is PKCS#7: its purchases are a few
/// hundred bytes, and the certificates it embeds (the same for every receipt the same key signed) about 3 KB of one of
/// the emulator's one-purchase receipts' 4.2 (4.0 KB of its 5.6 in Base64). Every upload is written to
/// `verification_receipts` until its job settles, so a stored receipt names the Base64 text of its certificates by its
/// SHA-256, kept once in `jws_headers`, and gives back the same characters.
///
/// The stored forms (`~` is not a Base64 character, so no receipt begins with one):
/// - the receipt as it came;
/// - `~RD.P.S`: the receipt is `P`, then the part named by `D` (its SHA-256 in 64 lowercase hex digits), then `S`.
///
/// The part is the Base64 of the whole three-byte groups inside the certificates field, so its characters are the same
/// wherever the field starts (one of three alignments). Only a receipt whose text is plain Base64 up to the part's end
/// is compacted, so that characters and bytes line up there; what follows (padding, line breaks) is kept as it came.
public enum StoredReceipt {
    /// A stored text in the compacted form whose part could not be read back (`jws_headers` lost the row).
    public struct PartMissing: Error {}

    /// A part shorter than this is not worth a name.
    public static let minimumPart = 512
    /// A receipt longer than this is stored as it came: the request's thread does not decode megabytes to spare a few
    /// kilobytes.
    public static let maximumCompacted = 64 * 1024
    /// A certificates field longer than this is not made into parts (its Base64 would pass `JWSHeaderBook`'s bound).
    public static let maximumField = 12 * 1024
    private static let marker = Array("~R".utf8)
    private static let dot = UInt8(ascii: ".")

    /// The characters of `receipt` that its certificates' whole three-byte groups are written in; nil when the receipt
    /// is not plain Base64 PKCS#7 with certificates up to there, or the part would be short.
    public static func sharedPart(of receipt: [UInt8]) -> Range<Int>? {
        guard receipt.first != UInt8(ascii: "~"), receipt.count <= maximumCompacted,
              let der = receipt.withUnsafeBufferPointer({ ReceiptDecoder.decode(base64: $0) }),
              let field = SignedData.certificatesRange(inDER: der), field.count <= maximumField else { return nil }
        let first = (field.lowerBound + 2) / 3, last = field.upperBound / 3  // whole groups, in groups
        guard last > first, (last - first) * 4 >= minimumPart, last * 4 <= receipt.count,
              receipt[..<(last * 4)].allSatisfy(isPlainBase64) else { return nil }
        return (first * 4)..<(last * 4)
    }

    /// The parts that receipts with the certificates of `receipt` may name, one for each of the three places the field
    /// can start at within a three-byte group (the purchases before it vary in length), in Base64; none when `receipt`
    /// is not Base64 PKCS#7 with certificates.
    public static func parts(of receipt: String) -> [String] {
        var text = receipt
        guard text.utf8.count <= maximumCompacted, let der = text.withUTF8({ ReceiptDecoder.decode(base64: $0) }),
              let field = SignedData.certificatesRange(inDER: der), field.count <= maximumField else { return [] }
        return (0..<3).compactMap { start -> String? in
            // The field starting at `start` past a group's first byte: its whole groups are from `skip` to `end`.
            let skip = (3 - start) % 3, end = (start + field.count) / 3 * 3 - start
            guard end > skip, (end - skip) / 3 * 4 >= minimumPart else { return nil }
            return Data(der[(field.lowerBound + skip)..<(field.lowerBound + end)]).base64EncodedString()
        }
    }

    /// `receipt` in its stored form, with the digest it names (nil for a receipt stored as it came). `digest` names a
    /// part, or gives nil for one it does not know (the receipt is then stored as it came).
    public static func compact(_ receipt: String, digest: (ArraySlice<UInt8>) -> String?) -> (text: String, digest: String?) {
        let bytes = Array(receipt.utf8)
        guard let part = sharedPart(of: bytes), let name = digest(bytes[part]), StoredJWS.isDigest(name.utf8) else { return (receipt, nil) }
        var form = marker
        form.reserveCapacity(bytes.count - part.count + 70)
        form.append(contentsOf: name.utf8)
        form.append(dot)
        form.append(contentsOf: bytes[..<part.lowerBound])
        form.append(dot)
        form.append(contentsOf: bytes[part.upperBound...])
        return (String(decoding: form, as: UTF8.self), name)
    }

    /// Whether `stored` is in the compacted form (else it is a receipt as it came, or another stored form).
    public static func isCompacted(_ stored: String) -> Bool { stored.utf8.starts(with: marker) }

    /// The digest a compacted form names; nil for any other text.
    public static func digest(of stored: String) -> String? {
        // Only the head is read: every job of an upload batch is asked on the writer's thread (`addReceiptParts`).
        let head = Array(stored.utf8.prefix(67))
        guard head.count == 67, head.starts(with: marker), head[66] == dot, StoredJWS.isDigest(head[2..<66]) else { return nil }
        return String(decoding: head[2..<66], as: UTF8.self)
    }

    /// The receipt a compacted form stands for, the part read with `part`; nil when the form is not one, or its part is
    /// not known.
    public static func expand(_ stored: String, part: (String) -> String?) -> String? {
        guard let name = digest(of: stored), let text = part(name) else { return nil }
        let bytes = Array(stored.utf8)
        guard let end = StoredJWS.index(of: dot, in: bytes[67...]) else { return nil }
        var receipt = Array(bytes[67..<end])
        receipt.reserveCapacity(bytes.count + text.utf8.count)
        receipt.append(contentsOf: text.utf8)
        receipt.append(contentsOf: bytes[(end + 1)...])
        return String(decoding: receipt, as: UTF8.self)
    }

    private static func isPlainBase64(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
             UInt8(ascii: "+"), UInt8(ascii: "/"): true
        default: false
        }
    }
}

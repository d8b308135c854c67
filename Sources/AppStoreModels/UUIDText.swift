import Foundation

/// A UUID read from its text as Apple writes it: 36 characters, hyphens at offsets 8, 13, 18 and 23, and hex digits
/// of either case everywhere else. Nothing else is a UUID here.
///
/// Foundation's `UUID(uuidString:)` on Linux reads the groups with `sscanf`, which also takes a sign, spaces and
/// `0x` inside them: `" 7d0c3c4-6a8e-…"` reads as `7D0C3C04-6A8E-…`, the UUID of another text, so two user ids could
/// share one `appAccountToken`. Apple's platforms refuse such text; so does this. It is also a notification's few
/// UUIDs read without `sscanf`'s cost.
public enum UUIDText {
    /// The UUID `text` spells, or nil.
    public static func parse(_ text: String) -> UUID? {
        var text = text
        return text.withUTF8 { bytes -> UUID? in
            guard bytes.count == 36 else { return nil }
            var uuid: uuid_t = (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
            let parsed = withUnsafeMutableBytes(of: &uuid) { out -> Bool in
                var read = 0, written = 0
                while read < 36 {
                    if read == 8 || read == 13 || read == 18 || read == 23 {
                        guard bytes[read] == UInt8(ascii: "-") else { return false }
                        read += 1
                        continue
                    }
                    guard let high = digit(bytes[read]), let low = digit(bytes[read + 1]) else { return false }
                    out[written] = high << 4 | low
                    read += 2
                    written += 1
                }
                return true
            }
            return parsed ? UUID(uuid: uuid) : nil
        }
    }

    private static func digit(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}

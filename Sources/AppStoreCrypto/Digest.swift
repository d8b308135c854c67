import COpenSSL

// Fetched once and never freed: EVP_MD objects are reference counted and safe to share between threads. A failed
// fetch (no default provider) falls back to the implicit fetch of the legacy getters, and leaves no error behind
// for a later, unrelated message.
nonisolated(unsafe) private let fetchedSHA1 = fetch("SHA1") ?? EVP_sha1()
nonisolated(unsafe) private let fetchedSHA256 = fetch("SHA256") ?? EVP_sha256()
nonisolated(unsafe) private let fetchedSHA384 = fetch("SHA384") ?? EVP_sha384()

private func fetch(_ name: String) -> OpaquePointer? {
    ERR_set_mark()
    defer { ERR_pop_to_mark() }
    return EVP_MD_fetch(nil, name, nil)
}

/// The message digests receipts use.
public enum Digest: Sendable {
    case sha1
    case sha256
    /// For StoreKit 2's `deviceVerification`; receipts never use it.
    case sha384

    /// The algorithm, fetched from OpenSSL's default provider once per process. `EVP_sha256()` and its kind are
    /// fetched again by name inside every `EVP_Digest` and every signing or verifying set-up.
    var md: OpaquePointer? {
        switch self {
        case .sha1: return fetchedSHA1
        case .sha256: return fetchedSHA256
        case .sha384: return fetchedSHA384
        }
    }

    /// A small number for each case, for tables (`DigestContextTemplates`).
    var index: Int {
        switch self {
        case .sha1: return 0
        case .sha256: return 1
        case .sha384: return 2
        }
    }

    /// The algorithm's object identifier.
    public var oid: String {
        switch self {
        case .sha1: return OID.sha1
        case .sha256: return OID.sha256
        case .sha384: return "2.16.840.1.101.3.4.2.2"
        }
    }

    /// The digest for an object identifier (SHA-1 or SHA-256 only).
    public init?(oid: String) {
        switch oid {
        case OID.sha1, OID.sha1WithRSA: self = .sha1
        case OID.sha256, OID.sha256WithRSA: self = .sha256
        default: return nil
        }
    }

    /// Hashes bytes.
    public func hash<Bytes: Collection>(_ bytes: Bytes) -> [UInt8] where Bytes.Element == UInt8 {
        if let digest = bytes.withContiguousStorageIfAvailable({ hash(UnsafeRawBufferPointer($0)) }) { return digest }
        return Array(bytes).withUnsafeBytes { hash($0) }
    }

    private func hash(_ input: UnsafeRawBufferPointer) -> [UInt8] {
        // A failed digest leaves the length at 0: an empty result.
        [UInt8](unsafeUninitializedCapacity: Int(EVP_MAX_MD_SIZE)) { buffer, count in
            var length: UInt32 = 0
            _ = EVP_Digest(input.baseAddress, input.count, buffer.baseAddress, &length, md, nil)
            count = Int(length)
        }
    }
}

extension Sequence where Element == UInt8 {
    /// Lower-case hexadecimal, two digits per byte (without String(format:), which is slow on hot paths).
    public var hexString: String {
        if let text = withContiguousStorageIfAvailable({ hexDigits($0) }) { return text }
        return Array(self).withUnsafeBufferPointer { hexDigits($0) }
    }
}

private func hexDigits(_ bytes: UnsafeBufferPointer<UInt8>) -> String {
    String(unsafeUninitializedCapacity: bytes.count * 2) { text in
        let digits: StaticString = "0123456789abcdef"
        let table = digits.utf8Start
        for (index, byte) in bytes.enumerated() {
            text[2 * index] = table[Int(byte >> 4)]
            text[2 * index + 1] = table[Int(byte & 0x0f)]
        }
        return bytes.count * 2
    }
}

import COpenSSL

/// The message digests receipts use.
public enum Digest: Sendable {
    case sha1
    case sha256
    /// For StoreKit 2's `deviceVerification`; receipts never use it.
    case sha384

    var md: OpaquePointer? {
        switch self {
        case .sha1: return EVP_sha1()
        case .sha256: return EVP_sha256()
        case .sha384: return EVP_sha384()
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
        let input = Array(bytes)
        var output = [UInt8](repeating: 0, count: Int(EVP_MAX_MD_SIZE))
        var length: UInt32 = 0
        _ = input.withUnsafeBytes { buffer in
            EVP_Digest(buffer.baseAddress, buffer.count, &output, &length, md, nil)
        }
        return Array(output.prefix(Int(length)))
    }
}

extension Sequence where Element == UInt8 {
    /// Lower-case hexadecimal, two digits per byte (without String(format:), which is slow on hot paths).
    public var hexString: String {
        let digits = Array("0123456789abcdef".utf8)
        var bytes: [UInt8] = []
        for byte in self {
            bytes.append(digits[Int(byte >> 4)])
            bytes.append(digits[Int(byte & 0x0f)])
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}

import COpenSSL
import Foundation

/// An owned OpenSSL key pair (`EVP_PKEY`).
// Immutable after creation; OpenSSL 3 allows concurrent signing with one EVP_PKEY because each
// operation creates its own EVP_MD_CTX, so sharing across threads is safe.
public final class PrivateKey: @unchecked Sendable {
    let pointer: OpaquePointer
    /// Signing contexts set up once per digest; each signature starts from a copy.
    private let signers: DigestContextTemplates

    init(owning pointer: OpaquePointer) {
        self.pointer = pointer
        signers = DigestContextTemplates(key: pointer, operation: .sign)
    }
    deinit { EVP_PKEY_free(pointer) }  // the templates' contexts hold references of their own until they go

    /// Generates an RSA key.
    public static func generateRSA(bits: Int32 = 2048) throws -> PrivateKey {
        guard let context = EVP_PKEY_CTX_new_id(NID_rsaEncryption, nil) else { throw CryptoError.openSSL("key_generation_failed", "cannot create an RSA context") }
        defer { EVP_PKEY_CTX_free(context) }
        guard EVP_PKEY_keygen_init(context) == 1, EVP_PKEY_CTX_set_rsa_keygen_bits(context, bits) == 1 else {
            throw CryptoError.openSSL("key_generation_failed", "cannot set up RSA key generation")
        }
        var key: OpaquePointer?
        guard EVP_PKEY_keygen(context, &key) == 1, let key else { throw CryptoError.openSSL("key_generation_failed", "RSA key generation failed") }
        return PrivateKey(owning: key)
    }

    /// Generates an elliptic-curve key on `curve` (`P-256` for ES256, `P-384`).
    public static func generateEC(curve: String = "P-256") throws -> PrivateKey {
        guard let context = EVP_PKEY_CTX_new_from_name(nil, "EC", nil) else {
            throw CryptoError.openSSL("key_generation_failed", "cannot create an EC context")
        }
        defer { EVP_PKEY_CTX_free(context) }
        guard EVP_PKEY_keygen_init(context) == 1, EVP_PKEY_CTX_set_group_name(context, curve) == 1 else {
            throw CryptoError.openSSL("key_generation_failed", "cannot set up EC key generation on \(curve)")
        }
        var key: OpaquePointer?
        guard EVP_PKEY_keygen(context, &key) == 1, let key else { throw CryptoError.openSSL("key_generation_failed", "EC key generation failed") }
        return PrivateKey(owning: key)
    }

    /// The public half, for checking this key's own signatures.
    public var publicKey: PublicKey {
        EVP_PKEY_up_ref(pointer)
        return PublicKey(owning: pointer)
    }

    /// ES256: ECDSA P-256 over SHA-256, as JOSE wants it — the raw 64-byte R‖S, not DER.
    public func signES256(_ data: [UInt8]) throws -> [UInt8] {
        try ECDSASignature.raw(fromDER: sign(data, digest: .sha256), size: 32)
    }

    /// Reads a PEM private key (PKCS#8 or traditional).
    public convenience init(pem: String) throws {
        let bio = try MemoryBIO(Array(pem.utf8))
        guard let key = PEM_read_bio_PrivateKey(bio.pointer, nil, nil, nil) else {
            throw CryptoError.openSSL("invalid_key", "not a PEM private key")
        }
        self.init(owning: key)
    }

    /// The key as PKCS#8 PEM.
    public var pem: String {
        let bio = MemoryBIO()
        PEM_write_bio_PrivateKey(bio.pointer, pointer, nil, nil, 0, nil, nil)
        return String(decoding: bio.contents, as: UTF8.self)
    }

    /// Signs `data` over the digest: RSA PKCS#1 v1.5 for RSA keys, DER ECDSA for EC keys.
    public func sign(_ data: [UInt8], digest: Digest) throws -> [UInt8] {
        guard let context = signers.context(for: digest) else { throw CryptoError.openSSL("signing_failed", "cannot start signing") }
        defer { EVP_MD_CTX_free(context) }
        var length = 0
        guard EVP_DigestSign(context, nil, &length, data, data.count) == 1 else { throw CryptoError.openSSL("signing_failed", "cannot size the signature") }
        var signature = [UInt8](repeating: 0, count: length)
        guard EVP_DigestSign(context, &signature, &length, data, data.count) == 1 else { throw CryptoError.openSSL("signing_failed", "signing failed") }
        return Array(signature.prefix(length))
    }
}

/// An owned public key, used to check signatures.
// Immutable after creation; verification creates per-call contexts (see PrivateKey).
public final class PublicKey: @unchecked Sendable {
    let pointer: OpaquePointer
    /// Verifying contexts set up once per digest; each verification starts from a copy.
    private let verifiers: DigestContextTemplates

    init(owning pointer: OpaquePointer) {
        self.pointer = pointer
        verifiers = DigestContextTemplates(key: pointer, operation: .verify)
    }
    deinit { EVP_PKEY_free(pointer) }

    /// Whether `signature` is a valid RSA PKCS#1 v1.5 signature of `data` under `digest`.
    public func isValidSignature<Data: Collection>(_ signature: [UInt8], for data: Data, digest: Digest) -> Bool where Data.Element == UInt8 {
        guard let context = verifiers.context(for: digest) else {
            ERR_clear_error()
            return false
        }
        defer { EVP_MD_CTX_free(context) }
        let bytes = Array(data)
        let result = EVP_DigestVerify(context, signature, signature.count, bytes, bytes.count)
        if result != 1 { ERR_clear_error() }
        return result == 1
    }
}

extension PublicKey {
    /// Reads a PEM public key (`BEGIN PUBLIC KEY`).
    public convenience init(pem: String) throws {
        let bio = try MemoryBIO(Array(pem.utf8))
        guard let key = PEM_read_bio_PUBKEY(bio.pointer, nil, nil, nil) else {
            throw CryptoError.openSSL("invalid_key", "not a PEM public key")
        }
        self.init(owning: key)
    }

    /// The key as SubjectPublicKeyInfo PEM.
    public var pem: String {
        let bio = MemoryBIO()
        PEM_write_bio_PUBKEY(bio.pointer, pointer)
        return String(decoding: bio.contents, as: UTF8.self)
    }

    /// Whether `signature` (raw 64-byte R‖S) is a valid ES256 signature of `data`.
    public func isValidES256(_ signature: [UInt8], for data: [UInt8]) -> Bool {
        guard signature.count == 64, let der = ECDSASignature.der(fromRaw: signature) else { return false }
        return isValidSignature(der, for: data, digest: .sha256)
    }
}

/// Converts ECDSA signatures between DER (OpenSSL, X.509) and raw R‖S (JOSE).
enum ECDSASignature {
    static func raw(fromDER der: [UInt8], size: Int) throws -> [UInt8] {
        var cursor: UnsafePointer<UInt8>? = nil
        let signature: OpaquePointer? = der.withUnsafeBufferPointer { buffer in
            cursor = buffer.baseAddress
            return d2i_ECDSA_SIG(nil, &cursor, buffer.count)
        }
        guard let signature else { throw CryptoError.openSSL("signing_failed", "not a DER ECDSA signature") }
        defer { ECDSA_SIG_free(signature) }
        var r: OpaquePointer?
        var s: OpaquePointer?
        ECDSA_SIG_get0(signature, &r, &s)
        var out = [UInt8](repeating: 0, count: size * 2)
        guard let r, let s, BN_bn2binpad(r, &out, Int32(size)) == size,
              out.withUnsafeMutableBufferPointer({ BN_bn2binpad(s, $0.baseAddress! + size, Int32(size)) }) == size else {
            throw CryptoError.openSSL("signing_failed", "ECDSA signature does not fit \(size) bytes")
        }
        return out
    }

    static func der(fromRaw raw: [UInt8]) -> [UInt8]? {
        let half = raw.count / 2
        guard half > 0, let signature = ECDSA_SIG_new() else { return nil }
        defer { ECDSA_SIG_free(signature) }
        let r = raw.withUnsafeBufferPointer { BN_bin2bn($0.baseAddress, Int32(half), nil) }
        let s = raw.withUnsafeBufferPointer { BN_bin2bn($0.baseAddress! + half, Int32(half), nil) }
        guard let r, let s, ECDSA_SIG_set0(signature, r, s) == 1 else { return nil }
        let length = i2d_ECDSA_SIG(signature, nil)
        guard length > 0 else { return nil }
        var out = [UInt8](repeating: 0, count: Int(length))
        var cursor: UnsafeMutablePointer<UInt8>? = nil
        out.withUnsafeMutableBufferPointer { buffer in
            cursor = buffer.baseAddress
            _ = i2d_ECDSA_SIG(signature, &cursor)
        }
        return out
    }
}

/// An owned memory BIO.
final class MemoryBIO {
    let pointer: OpaquePointer

    init() { pointer = BIO_new(BIO_s_mem()) }

    init(_ bytes: [UInt8]) throws {
        guard let bio = BIO_new(BIO_s_mem()) else { throw CryptoError.openSSL("out_of_memory", "cannot allocate a BIO") }
        pointer = bio
        _ = bytes.withUnsafeBytes { BIO_write(bio, $0.baseAddress, Int32($0.count)) }
    }

    deinit { BIO_free(pointer) }

    var contents: [UInt8] {
        var data: UnsafeMutablePointer<CChar>?
        let length = shim_BIO_get_mem_data(pointer, &data)
        guard let data, length > 0 else { return [] }
        return data.withMemoryRebound(to: UInt8.self, capacity: length) { Array(UnsafeBufferPointer(start: $0, count: length)) }
    }
}

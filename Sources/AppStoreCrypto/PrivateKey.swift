import COpenSSL
import Foundation

/// An owned OpenSSL key pair (`EVP_PKEY`).
// Immutable after creation; OpenSSL 3 allows concurrent signing with one EVP_PKEY because each
// operation creates its own EVP_MD_CTX, so sharing across threads is safe.
public final class PrivateKey: @unchecked Sendable {
    let pointer: OpaquePointer

    init(owning pointer: OpaquePointer) { self.pointer = pointer }
    deinit { EVP_PKEY_free(pointer) }

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

    /// Signs `data` with RSA PKCS#1 v1.5 over the digest.
    public func sign(_ data: [UInt8], digest: Digest) throws -> [UInt8] {
        guard let context = EVP_MD_CTX_new() else { throw CryptoError.openSSL("signing_failed", "no digest context") }
        defer { EVP_MD_CTX_free(context) }
        guard EVP_DigestSignInit(context, nil, digest.md, nil, pointer) == 1 else { throw CryptoError.openSSL("signing_failed", "cannot start signing") }
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
    init(owning pointer: OpaquePointer) { self.pointer = pointer }
    deinit { EVP_PKEY_free(pointer) }

    /// Whether `signature` is a valid RSA PKCS#1 v1.5 signature of `data` under `digest`.
    public func isValidSignature<Data: Collection>(_ signature: [UInt8], for data: Data, digest: Digest) -> Bool where Data.Element == UInt8 {
        guard let context = EVP_MD_CTX_new() else { return false }
        defer { EVP_MD_CTX_free(context) }
        guard EVP_DigestVerifyInit(context, nil, digest.md, nil, pointer) == 1 else {
            ERR_clear_error()
            return false
        }
        let bytes = Array(data)
        let result = EVP_DigestVerify(context, signature, signature.count, bytes, bytes.count)
        if result != 1 { ERR_clear_error() }
        return result == 1
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

import COpenSSL
import Foundation
import AppStoreModels

/// Verifies certificate chains against configured roots at a chosen time, with Apple's OID policy.
public struct ChainVerifier: Sendable {
    /// The trust anchors.
    public let roots: [Certificate]
    /// Accept chains that end at any certificate in `roots`, even one that is not self-signed
    /// (needed for the iTunes Store CA of iOS 6 receipts).
    public let allowPartialChain: Bool

    /// Creates a verifier.
    public init(roots: [Certificate], allowPartialChain: Bool = false) {
        self.roots = roots
        self.allowPartialChain = allowPartialChain
    }

    /// Which Apple marker extensions to require.
    public enum Policy: Sendable {
        /// Leaf needs 1.2.840.113635.100.6.11.1 and the first intermediate 1.2.840.113635.100.6.2.1.
        case appleReceiptSigning
        /// iOS 6 transaction receipts: the leaf needs 1.2.840.113635.100.6.5.1 (Apple's iTunes Store
        /// receipt certificate, issued by the iTunes Store CA), or the chain meets `appleReceiptSigning`.
        case appleTransactionReceiptSigning
        /// Chain validity only.
        case none
    }

    /// Throws unless `leaf` chains through `intermediates` to a root, valid at `date`.
    public func verify(leaf: Certificate, intermediates: [Certificate], at date: Date, policy: Policy) throws {
        guard let store = X509_STORE_new() else { throw CryptoError.openSSL("chain_failed", "no store") }
        defer { X509_STORE_free(store) }
        for root in roots { X509_STORE_add_cert(store, root.pointer) }
        guard let untrusted = shim_sk_X509_new_null() else { throw CryptoError.openSSL("chain_failed", "no stack") }
        defer { shim_sk_X509_free(untrusted) }
        for certificate in intermediates { _ = shim_sk_X509_push(untrusted, certificate.pointer) }
        guard let context = X509_STORE_CTX_new() else { throw CryptoError.openSSL("chain_failed", "no context") }
        defer { X509_STORE_CTX_free(context) }
        guard X509_STORE_CTX_init(context, store, leaf.pointer, untrusted) == 1 else {
            throw CryptoError.openSSL("chain_failed", "cannot initialise verification")
        }
        let parameters = X509_STORE_CTX_get0_param(context)
        X509_VERIFY_PARAM_set_time(parameters, time_t(ReceiptDate.milliseconds(date) / 1000))
        // Apple still signs with SHA-1 and 1024-bit keys in old chains; judge them by validity, not strength.
        X509_VERIFY_PARAM_set_auth_level(parameters, 0)
        if allowPartialChain { X509_VERIFY_PARAM_set_flags(parameters, UInt(X509_V_FLAG_PARTIAL_CHAIN)) }
        if X509_verify_cert(context) != 1 {
            let code = X509_STORE_CTX_get_error(context)
            let reason = String(cString: X509_verify_cert_error_string(Int(code)))
            ERR_clear_error()
            throw CryptoError("invalid_certificate_chain", "certificate chain rejected: \(reason)")
        }
        // The leaf must be allowed to sign, when it says what it may do (X509_get_key_usage: all bits when absent).
        guard X509_get_key_usage(leaf.pointer) & UInt32(KU_DIGITAL_SIGNATURE) != 0 else {
            throw CryptoError("invalid_key_usage", "the signing certificate's key usage does not allow digital signatures")
        }
        // Apple's markers are checked on the chain OpenSSL built, position by position, never on a
        // certificate that merely came along.
        switch policy {
        case .none:
            return
        case .appleReceiptSigning:
            try Self.checkReceiptSigningMarkers(context)
        case .appleTransactionReceiptSigning:
            guard let built = X509_STORE_CTX_get0_chain(context), let builtLeaf = shim_sk_X509_value(built, 0) else {
                throw CryptoError.openSSL("chain_failed", "no chain was built")
            }
            if Certificate.hasExtension(builtLeaf, OID.appleTransactionReceiptSigner) { return }
            do { try Self.checkReceiptSigningMarkers(context) } catch {
                throw CryptoError("missing_receipt_signer_oid",
                                  "the transaction receipt's certificate lacks 1.2.840.113635.100.6.5.1 and is not an Apple receipt signer")
            }
        }
    }

    /// The leaf carries 1.2.840.113635.100.6.11.1 and its issuer, an intermediate below a trusted root
    /// (not the root itself), carries 1.2.840.113635.100.6.2.1.
    private static func checkReceiptSigningMarkers(_ context: OpaquePointer) throws {
        guard let built = X509_STORE_CTX_get0_chain(context) else { throw CryptoError.openSSL("chain_failed", "no chain was built") }
        guard let builtLeaf = shim_sk_X509_value(built, 0), Certificate.hasExtension(builtLeaf, OID.appleReceiptSigner) else {
            throw CryptoError("missing_receipt_signer_oid", "the signing certificate lacks 1.2.840.113635.100.6.11.1")
        }
        guard shim_sk_X509_num(built) >= 3, let intermediate = shim_sk_X509_value(built, 1) else {
            throw CryptoError("missing_intermediate_oid", "Apple's chains have an intermediate between the signing certificate and the root")
        }
        guard Certificate.hasExtension(intermediate, OID.appleWWDRIntermediate) else {
            throw CryptoError("missing_intermediate_oid", "the intermediate certificate lacks 1.2.840.113635.100.6.2.1")
        }
    }
}

import COpenSSL
import Locking

/// Signing or verifying contexts set up once per digest for one key, each operation starting from a copy.
///
/// `EVP_DigestSignInit` and `EVP_DigestVerifyInit` look up the key's and the digest's algorithms by name on every
/// call (OpenSSL 3's provider fetches, walking its name tables): for an RSA receipt signature that was a third of the
/// verification's CPU. `EVP_MD_CTX_copy_ex` of a set-up context only takes references and duplicates the provider's
/// small state. The templates are only read once made (the copy's source is `const`); the lock guards their making
/// and copying, and is held for microseconds.
// `key` is only read by OpenSSL; the contexts are touched under the lock.
final class DigestContextTemplates: @unchecked Sendable {
    /// The purpose a template is set up for.
    enum Operation: Sendable {
        case sign
        case verify
    }

    /// An `EVP_MD_CTX` set up and never changed after.
    private struct Template: @unchecked Sendable {
        let context: OpaquePointer
    }

    private let key: OpaquePointer
    private let operation: Operation
    /// By `Digest.index`; nil until first used (or when setting it up failed).
    private let templates = Locked<[Template?]>([nil, nil, nil])

    /// Templates for `key`, which must outlive this object (its owner keeps both).
    init(key: OpaquePointer, operation: Operation) {
        self.key = key
        self.operation = operation
    }

    /// A new context ready to sign or verify under `digest` (the caller frees it), or nil when OpenSSL refuses the
    /// key and digest together (the error queue cleared).
    func context(for digest: Digest) -> OpaquePointer? {
        guard let copy = EVP_MD_CTX_new() else { return nil }
        let copied = templates.withLock { templates -> Bool in
            if templates[digest.index] == nil { templates[digest.index] = makeTemplate(digest) }
            guard let template = templates[digest.index] else { return false }
            return EVP_MD_CTX_copy_ex(copy, template.context) == 1
        }
        guard copied else {
            EVP_MD_CTX_free(copy)
            ERR_clear_error()
            return nil
        }
        return copy
    }

    deinit {
        templates.withLock { templates in for template in templates { EVP_MD_CTX_free(template?.context) } }
    }

    private func makeTemplate(_ digest: Digest) -> Template? {
        guard let context = EVP_MD_CTX_new() else { return nil }
        let ready = switch operation {
        case .sign: EVP_DigestSignInit(context, nil, digest.md, nil, key) == 1
        case .verify: EVP_DigestVerifyInit(context, nil, digest.md, nil, key) == 1
        }
        guard ready else {
            EVP_MD_CTX_free(context)
            return nil
        }
        return Template(context: context)
    }
}

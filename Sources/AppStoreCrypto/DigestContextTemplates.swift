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

    /// An `EVP_MD_CTX` set up and never changed after, or the set-up's failure (not tried again: a key that cannot
    /// sign or verify under a digest never will, and a hostile certificate's key would otherwise cost a set-up a call).
    private enum Template: @unchecked Sendable {
        case unmade
        case ready(OpaquePointer)
        case refused
    }

    private let key: OpaquePointer
    private let operation: Operation
    /// By `Digest.index`.
    private let templates = Locked<[Template]>([.unmade, .unmade, .unmade])

    /// Templates for `key`, which must outlive this object (its owner keeps both).
    init(key: OpaquePointer, operation: Operation) {
        self.key = key
        self.operation = operation
    }

    /// A new context ready for one signature or verification under `digest` (the caller frees it), or nil when
    /// OpenSSL refuses the key and digest together. OpenSSL's reason, when it gave one, is left on its error queue for
    /// the caller (the first time only: a refusal is remembered).
    func context(for digest: Digest) -> OpaquePointer? {
        guard let copy = EVP_MD_CTX_new() else { return nil }
        let copied = templates.withLock { templates -> Bool in
            if case .unmade = templates[digest.index] { templates[digest.index] = makeTemplate(digest) }
            guard case .ready(let template) = templates[digest.index] else { return false }
            return EVP_MD_CTX_copy_ex(copy, template) == 1
        }
        guard copied else {
            EVP_MD_CTX_free(copy)
            return nil
        }
        return copy
    }

    deinit {
        templates.withLock { templates in
            for case .ready(let context) in templates { EVP_MD_CTX_free(context) }
        }
    }

    private func makeTemplate(_ digest: Digest) -> Template {
        guard let context = EVP_MD_CTX_new() else { return .unmade }
        let ready = switch operation {
        case .sign: EVP_DigestSignInit(context, nil, digest.md, nil, key) == 1
        case .verify: EVP_DigestVerifyInit(context, nil, digest.md, nil, key) == 1
        }
        guard ready else {
            EVP_MD_CTX_free(context)
            return .refused
        }
        // Each copy is used once: its final step may use the copy's own key context instead of duplicating it again.
        EVP_MD_CTX_set_flags(context, EVP_MD_CTX_FLAG_FINALISE)
        return .ready(context)
    }
}

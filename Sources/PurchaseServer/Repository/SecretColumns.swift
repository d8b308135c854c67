import AppStoreCrypto
import Foundation

/// How secrets are stored: sealed with the master key on the way in and opened on the way out; with no
/// master key they are stored as given, and a sealed value that does not open reads as absent.
struct SecretColumns: Sendable {
    let secrets: SecretBox?

    func seal(_ secret: String?) throws -> String? {
        guard let secret, let secrets else { return secret }
        return try secrets.seal(secret)
    }

    func unseal(_ stored: String?) -> String? {
        guard let stored else { return nil }
        guard SecretBox.isSealed(stored) else { return stored }
        return try? secrets?.open(stored)
    }
}

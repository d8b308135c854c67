import AppStoreCrypto
import Foundation

/// The JWS chain's revocation status, as the OCSP responder its certificates name reports it.
extension AppStoreEmulator {
    /// A certificate of the JWS chain that can be revoked (the root cannot: a verifier trusts it directly).
    public enum ChainCertificate: String, Sendable, CaseIterable {
        case leaf, intermediate
    }

    /// Answers a DER OCSP request about the JWS chain. A read: answering never changes the emulator.
    /// Times are the real clock's, since verifiers compare `thisUpdate` with their own.
    public func ocspResponse(to request: [UInt8], now: Date = Date()) async throws -> [UInt8] {
        guard let responder = jwsAuthority.ocspResponder else { throw StoreError.invalid("This JWS chain was saved without its signing keys.", code: "ocsp_unavailable") }
        let revoked = try await read { state, _ in state.revokedCertificates }
        let leafDER = jwsAuthority.leaf.der
        return responder.respond(to: request, status: { certificate in
            let name: ChainCertificate = certificate.der == leafDER ? .leaf : .intermediate
            return revoked[name.rawValue].map { .revoked(at: $0) } ?? .good
        }, now: now)
    }

    /// The certificates marked revoked, with when.
    public func revokedCertificates() async throws -> [ChainCertificate: Date] {
        try await read { state, _ in
            Dictionary(uniqueKeysWithValues: state.revokedCertificates.compactMap { key, date in ChainCertificate(rawValue: key).map { ($0, date) } })
        }
    }

    /// Marks a certificate of the JWS chain revoked (from now, by the emulator's clock), or good again.
    public func setRevoked(_ certificate: ChainCertificate, _ revoked: Bool) async throws {
        try await mutate { state, changes, now in
            state.revokedCertificates[certificate.rawValue] = revoked ? (state.revokedCertificates[certificate.rawValue] ?? now) : nil
            changes.settings = true
        }
    }
}

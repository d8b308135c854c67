import AppStoreCrypto
import Foundation

/// The certificates receipts must chain to: self-signed roots are trust anchors, others are
/// intermediates used to build chains (the iTunes Store CA that iOS 6 receipts do not embed).
public struct TrustStore: Sendable {
    public let roots: [Certificate]
    public let intermediates: [Certificate]

    /// Splits certificates into anchors and intermediates.
    public init(certificates: [Certificate]) {
        var roots: [Certificate] = []
        var intermediates: [Certificate] = []
        for certificate in certificates {
            if let fields = try? certificate.fields, fields.issuer == fields.subject { roots.append(certificate) } else { intermediates.append(certificate) }
        }
        self.roots = roots
        self.intermediates = intermediates
    }

    /// Apple's production roots (Apple Inc. Root, the iTunes Store CA for iOS 6 receipts, Root CA - G3).
    public static func apple() throws -> TrustStore {
        let pems = [AppleRootCertificates.appleIncRoot, AppleRootCertificates.iTunesStoreCA, AppleRootCertificates.appleRootG3]
        return TrustStore(certificates: try pems.flatMap { try Certificate.parsePEM($0) })
    }

    /// Certificates from PEM files.
    public static func load(pemFiles: [String]) throws -> TrustStore {
        var certificates: [Certificate] = []
        for path in pemFiles {
            guard let data = FileManager.default.contents(atPath: path) else {
                throw ServerError(.trustFileUnreadable, "cannot read trust file \(path)")
            }
            certificates += try Certificate.parsePEM(String(decoding: data, as: UTF8.self))
        }
        return TrustStore(certificates: certificates)
    }

    var verifier: ChainVerifier { ChainVerifier(roots: roots) }
}

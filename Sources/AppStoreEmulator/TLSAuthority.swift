import AppStoreCrypto
import AppStoreModels
import Foundation

/// The App Store hosts a backend calls, which the emulator answers over TLS (through its `CONNECT` proxy or a
/// hosts entry), and what each one serves.
public enum AppleHosts {
    /// verifyReceipt, production and sandbox.
    public static let verifyReceipt = ["buy.itunes.apple.com": AppStoreEnvironment.production, "sandbox.itunes.apple.com": .sandbox]
    /// The App Store Server API: the original names and the ones Apple added in 2026.
    public static let serverAPI = [
        "api.storekit.itunes.apple.com": AppStoreEnvironment.production, "api.storekit-sandbox.itunes.apple.com": .sandbox,
        "api.storekit.apple.com": .production, "api.storekit-sandbox.apple.com": .sandbox,
    ]
    /// The OCSP responder named by the JWS chain's certificates.
    public static let ocsp = "ocsp.apple.com"

    /// Every name the TLS certificate carries and the proxy tunnels to.
    /// Made once: every request to the emulator asks whether its Host is one of them.
    public static let all: Set<String> = Set(verifyReceipt.keys).union(serverAPI.keys).union([ocsp])
}

/// The emulator's TLS root and the server certificate it issues for `AppleHosts.all`, kept as PEM files.
///
/// Distinct from the signing chains: a backend trusts this root for HTTPS only (`SSL_CERT_FILE`,
/// `REQUESTS_CA_BUNDLE`, `NODE_EXTRA_CA_CERTS`, a Java trust store), and the receipt or JWS roots for data.
/// The server certificate lives a year, as public TLS certificates do, and is issued again under the same
/// root when less than a month is left, so an exported root stays trusted.
public struct TLSAuthority: Sendable {
    public let root: Certificate
    public let server: Certificate
    public let serverKey: PrivateKey

    /// The server certificate then the root, as a TLS server sends them.
    public var chainPEM: String { server.pem + root.pem }

    public static func loadOrCreate(in directory: URL, now: Date = Date()) throws -> TLSAuthority {
        let files = ["root.pem", "root-key.pem", "server.pem", "server-key.pem"].map { directory.appendingPathComponent($0) }
        let rootKey: PrivateKey
        let root: Certificate
        if FileManager.default.fileExists(atPath: files[0].path), FileManager.default.fileExists(atPath: files[1].path) {
            root = try Certificate.parsePEM(String(contentsOf: files[0], encoding: .utf8))[0]
            rootKey = try PrivateKey(pem: String(contentsOf: files[1], encoding: .utf8))
        } else {
            rootKey = try PrivateKey.generateEC(curve: "P-256")
            var builder = CertificateBuilder(
                subject: [("C", "US"), ("O", "Storekeeper"), ("CN", "Storekeeper Emulator TLS Root")],
                serial: UInt64.random(in: 1...UInt64(1) << 48), notBefore: Date(timeIntervalSince1970: 946_684_800),
                notAfter: Date(timeIntervalSince1970: 4_102_444_799), isCertificateAuthority: true, pathLength: 0
            )
            // Trusting this root trusts it for apple.com names only: were its key to leak, it could not vouch for any other site.
            builder.extensions = [("nameConstraints", "critical,permitted;DNS:apple.com")]
            root = try builder.issue(for: rootKey, issuer: nil, issuerKey: rootKey)
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            try write(root.pem, to: files[0], secret: false)
            try write(rootKey.pem, to: files[1], secret: true)
            try? FileManager.default.removeItem(at: files[2])
        }
        if FileManager.default.fileExists(atPath: files[2].path), FileManager.default.fileExists(atPath: files[3].path) {
            let server = try Certificate.parsePEM(String(contentsOf: files[2], encoding: .utf8))[0]
            let fields = try server.fields
            if fields.issuer == (try root.fields.subject), fields.notAfter.timeIntervalSince(now) > 30 * 86_400, fields.notBefore <= now {
                return TLSAuthority(root: root, server: server, serverKey: try PrivateKey(pem: String(contentsOf: files[3], encoding: .utf8)))
            }
        }
        let serverKey = try PrivateKey.generateEC(curve: "P-256")
        var builder = CertificateBuilder(
            subject: [("C", "US"), ("O", "Storekeeper"), ("CN", "buy.itunes.apple.com")],
            serial: UInt64.random(in: 1...UInt64(1) << 48), notBefore: now.addingTimeInterval(-86_400),
            notAfter: now.addingTimeInterval(365 * 86_400), isCertificateAuthority: false
        )
        builder.extensions = [("subjectAltName", AppleHosts.all.sorted().map { "DNS:" + $0 }.joined(separator: ",")),
                              ("extendedKeyUsage", "serverAuth")]
        let server = try builder.issue(for: serverKey, issuer: root, issuerKey: rootKey)
        try write(server.pem, to: files[2], secret: false)
        try write(serverKey.pem, to: files[3], secret: true)
        return TLSAuthority(root: root, server: server, serverKey: serverKey)
    }

    private static func write(_ text: String, to file: URL, secret: Bool) throws {
        if secret { try PrivateFile.write(text, to: file) } else { try text.write(to: file, atomically: true, encoding: .utf8) }
    }
}

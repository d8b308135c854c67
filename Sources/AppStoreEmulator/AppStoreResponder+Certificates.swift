import AppStoreCrypto
import AppStoreModels
import Foundation
import HTTP

/// The roots a backend trusts, the OCSP responder the JWS chain names, and revocation for testing online checks.
extension AppStoreResponder {
    static func addCertificateRoutes(_ router: inout Router, _ emulator: AppStoreEmulator, tlsRoot: Certificate?) {
        router.on(.get, "/admin/v1/ca") { request in
            if request.query["tls"] == "true" {
                guard let tlsRoot else {
                    return HTTPError(.notFound, code: "tls_off", message: "This emulator does not serve Apple's host names over TLS.").response
                }
                return .text(tlsRoot.pem, contentType: "application/x-pem-file")
            }
            if request.query["xcode"] == "true" { return .text(emulator.xcodeAuthority.certificate.pem, contentType: "application/x-pem-file") }
            if request.query["xcode"] == "receipts", let certificate = emulator.xcodeAuthority.receiptCertificate {
                return .text(certificate.pem, contentType: "application/x-pem-file")
            }
            let chain = request.query["chain"] == "true"
            // ?jws=true: the ECC chain that signs StoreKit 2 data (Apple Root CA - G3's role), else the receipt chain.
            let authority = request.query["jws"] == "true" ? emulator.jwsAuthority : emulator.authority
            let pem = chain ? authority.root.pem + authority.intermediate.pem : authority.root.pem
            return .text(pem, contentType: "application/x-pem-file")
        }
        // What ocsp.apple.com answers (requests for that host are routed here): POST, as Apple's verifiers send, and
        // RFC 6960's GET form, the DER request in Base64 (URL-escaped) as the last path segment.
        router.on(.post, "/ocsp") { request in
            await handle {
                let answer = try await emulator.ocspResponse(to: Array(request.body))
                return Response(status: .ok, headers: ["Content-Type": "application/ocsp-response", "Cache-Control": "no-store"], body: Data(answer))
            }
        }
        router.on(.get, "/ocsp/:request") { request in
            await handle {
                // A request is a few hundred bytes; RFC 6960 keeps GET for those under 255 bytes of Base64.
                let text = request.parameters["request"] ?? ""
                guard text.utf8.count <= 4096, let der = Data(base64Encoded: text) else {
                    throw StoreError.invalid("The OCSP request is the Base64 of a DER OCSPRequest.", code: "invalid_ocsp_request")
                }
                let answer = try await emulator.ocspResponse(to: Array(der))
                return Response(status: .ok, headers: ["Content-Type": "application/ocsp-response", "Cache-Control": "no-store"], body: Data(answer))
            }
        }
        router.on(.get, "/admin/v1/ca/revocations") { _ in
            await handle { .json(revocationBody(try await emulator.revokedCertificates())) }
        }
        for (method, revoked) in [(HTTPMethod.post, true), (.delete, false)] {
            router.on(method, "/admin/v1/ca/revocations") { request in
                await handle {
                    let name = try request.required("certificate")
                    guard let certificate = AppStoreEmulator.ChainCertificate(rawValue: name) else {
                        throw StoreError.invalid("certificate must be leaf or intermediate.", code: "invalid_certificate")
                    }
                    try await emulator.setRevoked(certificate, revoked)
                    return .json(revocationBody(try await emulator.revokedCertificates()))
                }
            }
        }
    }

    private static func revocationBody(_ revoked: [AppStoreEmulator.ChainCertificate: Date]) -> [String: [[String: String]]] {
        ["revoked": revoked.sorted { $0.key.rawValue < $1.key.rawValue }.map { ["certificate": $0.key.rawValue, "revokedAt": ReceiptDate.rfc3339($0.value)] }]
    }
}

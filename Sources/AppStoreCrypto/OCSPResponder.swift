import COpenSSL
import Foundation

/// Answers OCSP requests (RFC 6960) for certificates this process issued, as Apple's `ocsp.apple.com` does for
/// its WWDR chain: each status is signed by the certificate's own issuer (so a verifier needs no delegated
/// responder), names the responder by key hash, and echoes the request's nonce.
public struct OCSPResponder: Sendable {
    /// A certificate whose status can be asked, with what signs answers about it.
    public struct Issued: Sendable {
        public let certificate: Certificate
        public let issuer: Certificate
        public let issuerKey: PrivateKey

        public init(certificate: Certificate, issuer: Certificate, issuerKey: PrivateKey) {
            self.certificate = certificate
            self.issuer = issuer
            self.issuerKey = issuerKey
        }
    }

    /// What a certificate's status is now.
    public enum Status: Sendable, Equatable {
        case good
        case revoked(at: Date)
    }

    /// Most certificates asked about in one request; Apple's verifiers ask one at a time.
    public static let requestLimit = 8
    /// Largest request accepted (a request for one certificate is about 100 bytes).
    public static let sizeLimit = 4 << 10

    public let issued: [Issued]

    public init(issued: [Issued]) { self.issued = issued }

    /// The DER `OCSPResponse` for a DER `OCSPRequest`.
    /// - Parameters:
    ///   - status: the status of one of `issued` (called only for certificates found).
    ///   - now: `thisUpdate` and `producedAt`; answers are valid for a day after.
    /// A request that does not parse is answered `malformedRequest`; one naming no certificate issued here,
    /// `unauthorized` (as responders answer for certificates they do not serve).
    public func respond(to request: [UInt8], status: (Certificate) -> Status, now: Date) -> [UInt8] {
        guard request.count <= Self.sizeLimit, let parsed = Self.parseRequest(request) else { return Self.bare(OCSP_RESPONSE_STATUS_MALFORMEDREQUEST) }
        defer { OCSP_REQUEST_free(parsed) }
        let count = OCSP_request_onereq_count(parsed)
        guard count > 0, count <= Self.requestLimit else { return Self.bare(OCSP_RESPONSE_STATUS_MALFORMEDREQUEST) }
        var signer: Issued?
        var answers: [(OpaquePointer, Issued?)] = []
        for index in 0..<count {
            guard let one = OCSP_request_onereq_get0(parsed, index), let id = OCSP_onereq_get0_id(one) else {
                return Self.bare(OCSP_RESPONSE_STATUS_MALFORMEDREQUEST)
            }
            let match = issued.first { Self.matches(id, $0) }
            // One response has one signer: certificates of another issuer than the first found are answered unknown.
            if let match, signer == nil { signer = match }
            answers.append((id, match.flatMap { $0.issuer.der == signer?.issuer.der ? $0 : nil }))
        }
        guard let signer, let basic = OCSP_BASICRESP_new() else { return Self.bare(OCSP_RESPONSE_STATUS_UNAUTHORIZED) }
        defer { OCSP_BASICRESP_free(basic) }
        let thisUpdate = ASN1_TIME_set(nil, time_t(now.timeIntervalSince1970))
        let nextUpdate = ASN1_TIME_set(nil, time_t(now.timeIntervalSince1970 + 86_400))
        defer {
            ASN1_TIME_free(thisUpdate)
            ASN1_TIME_free(nextUpdate)
        }
        for (id, match) in answers {
            guard let match else {
                OCSP_basic_add1_status(basic, id, V_OCSP_CERTSTATUS_UNKNOWN, 0, nil, thisUpdate, nextUpdate)
                continue
            }
            switch status(match.certificate) {
            case .good:
                OCSP_basic_add1_status(basic, id, V_OCSP_CERTSTATUS_GOOD, 0, nil, thisUpdate, nextUpdate)
            case .revoked(let date):
                let revoked = ASN1_TIME_set(nil, time_t(date.timeIntervalSince1970))
                OCSP_basic_add1_status(basic, id, V_OCSP_CERTSTATUS_REVOKED, OCSP_REVOKED_STATUS_KEYCOMPROMISE, revoked, thisUpdate, nextUpdate)
                ASN1_TIME_free(revoked)
            }
        }
        _ = OCSP_copy_nonce(basic, parsed)
        guard OCSP_basic_sign(basic, signer.issuer.pointer, signer.issuerKey.pointer, Digest.sha256.md, nil, UInt(OCSP_RESPID_KEY)) == 1 else {
            ERR_clear_error()
            return Self.bare(OCSP_RESPONSE_STATUS_INTERNALERROR)
        }
        guard let response = OCSP_response_create(OCSP_RESPONSE_STATUS_SUCCESSFUL, basic) else { return Self.bare(OCSP_RESPONSE_STATUS_INTERNALERROR) }
        defer { OCSP_RESPONSE_free(response) }
        return Self.encode(response)
    }

    private static func parseRequest(_ bytes: [UInt8]) -> OpaquePointer? {
        bytes.withUnsafeBufferPointer { buffer -> OpaquePointer? in
            var cursor = buffer.baseAddress
            let request = d2i_OCSP_REQUEST(nil, &cursor, buffer.count)
            // Trailing bytes after the request are as malformed as a short one.
            if let request, cursor != buffer.baseAddress.map({ $0 + buffer.count }) {
                OCSP_REQUEST_free(request)
                return nil
            }
            if request == nil { ERR_clear_error() }
            return request
        }
    }

    /// Whether a requested CertID names `candidate`, under the hash the request chose.
    private static func matches(_ id: OpaquePointer, _ candidate: Issued) -> Bool {
        var algorithm: OpaquePointer?
        guard OCSP_id_get0_info(nil, &algorithm, nil, nil, id) == 1, let algorithm, let name = OBJ_nid2sn(OBJ_obj2nid(algorithm)), let digest = EVP_get_digestbyname(name),
              let own = OCSP_cert_to_id(digest, candidate.certificate.pointer, candidate.issuer.pointer) else { return false }
        defer { OCSP_CERTID_free(own) }
        return OCSP_id_cmp(id, own) == 0
    }

    /// A response with only a status (every failure status carries no body).
    private static func bare(_ status: Int32) -> [UInt8] {
        guard let response = OCSP_response_create(status, nil) else { return [] }
        defer { OCSP_RESPONSE_free(response) }
        return encode(response)
    }

    private static func encode(_ response: OpaquePointer) -> [UInt8] {
        let length = i2d_OCSP_RESPONSE(response, nil)
        guard length > 0 else { return [] }
        var bytes = [UInt8](repeating: 0, count: Int(length))
        bytes.withUnsafeMutableBufferPointer { buffer in
            var out = buffer.baseAddress
            _ = i2d_OCSP_RESPONSE(response, &out)
        }
        return bytes
    }
}

import COpenSSL

/// A cryptographic failure with a stable code; messages never contain key material.
public struct CryptoError: Error, Sendable, CustomStringConvertible, Equatable {
    /// A stable machine-readable code such as `invalid_certificate` or `signature_mismatch`.
    public let code: String
    /// What went wrong, safe to log.
    public let message: String

    public init(_ code: String, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "\(code): \(message)" }

    /// An error carrying OpenSSL's last queued error text.
    static func openSSL(_ code: String, _ what: String) -> CryptoError {
        var detail = ""
        let error = ERR_get_error()
        if error != 0 {
            var buffer = [CChar](repeating: 0, count: 256)
            ERR_error_string_n(error, &buffer, buffer.count)
            detail = ": " + String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        }
        ERR_clear_error()
        return CryptoError(code, what + detail)
    }
}

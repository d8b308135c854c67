import Foundation

/// The one rule for identifiers a client chooses (app user ids, idempotency keys, balance
/// currencies): valid UTF-8, no control characters, normalised to NFC, then 1…`maximumBytes`
/// bytes of UTF-8. Applied at the edge, before any comparison or storage, so an id means one
/// user to the allow-list, to SQLite and to PostgreSQL alike (Swift's `==` treats NFC and NFD as
/// equal, SQL compares bytes), and no id is ever silently truncated at a NUL.
public struct ClientIdentifier: Sendable, Hashable, CustomStringConvertible {
    /// What an identifier names; the error code and message follow from it.
    public struct Kind: Sendable, Hashable {
        /// The field's name as the API spells it.
        public let field: String
        /// The error code for a value that breaks the rule.
        public let errorCode: ServerError.Code
        /// The most UTF-8 bytes allowed after normalisation.
        public let maximumBytes: Int

        /// An app user id (`appUserId`, `/v1/users/{id}`).
        public static let appUserId = Kind(field: "appUserId", errorCode: .invalidUserId, maximumBytes: 256)
        /// A spend's idempotency key.
        public static let idempotencyKey = Kind(field: "Idempotency-Key", errorCode: .invalidIdempotencyKey, maximumBytes: 256)
        /// A balance's currency (`coins`).
        public static let currency = Kind(field: "currency", errorCode: .invalidCurrency, maximumBytes: 64)
        /// An entitlement a promotional grant names.
        public static let entitlement = Kind(field: "entitlement", errorCode: .invalidEntitlement, maximumBytes: 64)
        /// Why support granted, revoked or adjusted something.
        public static let reason = Kind(field: "reason", errorCode: .invalidReason, maximumBytes: 512)
        /// A product id an upload names (`DeliveryHint`).
        public static let productId = Kind(field: "productId", errorCode: .invalidProductId, maximumBytes: 256)
    }

    /// The normalised (NFC) text.
    public let value: String
    public var description: String { value }

    /// Validates and normalises `text`, or throws a 400 naming the rule.
    public init(_ text: String, _ kind: Kind) throws(ServerError) {
        // Printable ASCII (nearly every id) is already NFC and has no control characters: no Unicode work.
        let utf8 = text.utf8
        if !utf8.isEmpty, utf8.count <= kind.maximumBytes, utf8.allSatisfy({ $0 >= 0x20 && $0 < 0x7f }) {
            value = text
            return
        }
        if let problem = Self.problem(text, kind) {
            throw ServerError(kind.errorCode, "\(kind.field) must be 1–\(kind.maximumBytes) bytes of UTF-8 without control characters; \(problem).")
        }
        value = text.precomposedStringWithCanonicalMapping
    }

    /// Why `text` breaks the rule, or nil when it keeps it.
    static func problem(_ text: String, _ kind: Kind) -> String? {
        if text.unicodeScalars.contains(where: { $0.properties.generalCategory == .control }) { return "this one holds a control character" }
        let bytes = text.precomposedStringWithCanonicalMapping.utf8.count
        if bytes == 0 { return "this one is empty" }
        if bytes > kind.maximumBytes { return "this one is \(bytes) bytes" }
        return nil
    }
}

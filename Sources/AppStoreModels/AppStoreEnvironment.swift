/// The App Store environment a purchase or receipt belongs to, spelled as Apple spells it.
public enum AppStoreEnvironment: String, Codable, Sendable, CaseIterable {
    case sandbox = "Sandbox"
    case production = "Production"

    /// Parses `sandbox`/`production` in any letter case.
    public init?(loose value: String) {
        switch value.lowercased() {
        case "sandbox": self = .sandbox
        case "production": self = .production
        default: return nil
        }
    }

    /// The lower-case path component used by verifyReceipt routes.
    public var pathComponent: String { rawValue.lowercased() }

    /// The `receipt_type` an app receipt of this environment carries.
    public var receiptType: ReceiptType { self == .sandbox ? .productionSandbox : .production }
}

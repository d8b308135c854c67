/// The `receipt_type` (ASN.1 attribute 0) of an app receipt.
public struct ReceiptType: RawRepresentable, Hashable, Codable, Sendable {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }

    public static let production = ReceiptType(rawValue: "Production")
    public static let productionVPP = ReceiptType(rawValue: "ProductionVPP")
    public static let productionSandbox = ReceiptType(rawValue: "ProductionSandbox")
    public static let productionVPPSandbox = ReceiptType(rawValue: "ProductionVPPSandbox")
    public static let xcode = ReceiptType(rawValue: "Xcode")

    /// The environment the receipt routes to, or nil for Xcode and unknown types.
    public var environment: AppStoreEnvironment? {
        switch self {
        case .production, .productionVPP: return .production
        case .productionSandbox, .productionVPPSandbox: return .sandbox
        default: return nil
        }
    }
}

/// The body of `POST /verifyReceipt`.
public struct VerifyReceiptRequest: Codable, Sendable {
    /// The Base64 app receipt or iOS 6 style transaction receipt.
    public var receiptData: String?
    /// The app's shared secret.
    public var password: String?
    /// Only the latest renewal of each subscription in `latest_receipt_info`.
    public var excludeOldTransactions: Bool?

    enum CodingKeys: String, CodingKey {
        case receiptData = "receipt-data"
        case password
        case excludeOldTransactions = "exclude-old-transactions"
    }

    /// Creates a request.
    public init(receiptData: String?, password: String? = nil, excludeOldTransactions: Bool? = nil) {
        self.receiptData = receiptData
        self.password = password
        self.excludeOldTransactions = excludeOldTransactions
    }

    /// Reads a request body as `init(from:)` does, with the small JSON parser (JSONDecoder cost more than the rest
    /// of a one-purchase verification); nil when the body is not a JSON object.
    public init?(json body: some Collection<UInt8>) {
        guard case .object(let fields)? = try? JSONValue.parse(body) else { return nil }
        func string(_ key: String) -> String? {
            if case .string(let value)? = fields[key] { return value }
            return nil
        }
        receiptData = string(CodingKeys.receiptData.rawValue)
        password = string(CodingKeys.password.rawValue)
        switch fields[CodingKeys.excludeOldTransactions.rawValue] {
        case .bool(let flag)?: excludeOldTransactions = flag
        case .number(let text)?: excludeOldTransactions = Int(text).map { $0 != 0 }
        case .string(let text)?: excludeOldTransactions = text == "true" || text == "1"
        default: excludeOldTransactions = nil
        }
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        receiptData = try? container.decodeIfPresent(String.self, forKey: .receiptData)
        password = try? container.decodeIfPresent(String.self, forKey: .password)
        // Clients send true/false, 1/0 or "true"; read them all.
        if let flag = try? container.decodeIfPresent(Bool.self, forKey: .excludeOldTransactions) {
            excludeOldTransactions = flag
        } else if let number = try? container.decodeIfPresent(Int.self, forKey: .excludeOldTransactions) {
            excludeOldTransactions = number != 0
        } else if let text = try? container.decodeIfPresent(String.self, forKey: .excludeOldTransactions) {
            excludeOldTransactions = text == "true" || text == "1"
        } else {
            excludeOldTransactions = nil
        }
    }
}

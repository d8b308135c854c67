/// The App Store Connect review states of an in-app purchase (seed 003).
public enum ReviewState: String, Codable, Sendable, CaseIterable {
    case pendingDeveloperApproval = "Pending Developer Approval"
    case missingMetadata = "Missing Metadata"
    case readyToSubmit = "Ready to Submit"
    case waitingForReview = "Waiting for Review"
    case inReview = "In Review"
    case approved = "Approved"
    case readyForSale = "Ready for Sale"
    case rejected = "Rejected"
    case developerRemovedFromSale = "Developer Removed from Sale"

    /// Parses the display form or a snake/kebab/camel form (`ready_for_sale`, `readyForSale`).
    public init?(loose value: String) {
        let key = value.lowercased().filter { $0.isLetter }
        guard let state = ReviewState.allCases.first(where: { $0.rawValue.lowercased().filter { $0.isLetter } == key }) else { return nil }
        self = state
    }

    /// Whether the product can be bought in an environment, given its cleared-for-sale switch.
    public func isPurchasable(in environment: AppStoreEnvironment, clearedForSale: Bool) -> Bool {
        switch environment {
        case .production: return self == .readyForSale && clearedForSale
        case .sandbox: return self != .rejected && self != .developerRemovedFromSale
        }
    }
}

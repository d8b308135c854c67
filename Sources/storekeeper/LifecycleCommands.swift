import Foundation

/// `storekeeper appstore subscription renew|expire|fail-billing|resolve-billing ORIGINAL_TRANSACTION_ID`:
/// StoreKitTest's SKTestSession controls, against a running emulator.
struct SubscriptionControlCommand: Command {
    enum Action: String, CaseIterable {
        case renew, expire
        case failBilling = "fail-billing"
        case resolveBilling = "resolve-billing"
        case priceIncrease = "price-increase"
        case consentPriceIncrease = "consent-price-increase"
        case billingPlan = "billing-plan"

        var path: String {
            switch self {
            case .renew: return "renew"
            case .expire: return "expire"
            case .failBilling: return "billing-issue?enabled=true"
            case .resolveBilling: return "billing-issue?enabled=false"
            case .priceIncrease: return "price-increase"
            case .consentPriceIncrease: return "price-increase/consent"
            case .billingPlan: return "billing-plan"
            }
        }
    }

    static let abstract = "Drive a subscription: renew now, expire now, fail billing (retry, grace), resolve billing (recover)."
    static let help = """
    renew|expire|fail-billing|resolve-billing|price-increase|consent-price-increase|billing-plan ORIGINAL_TRANSACTION_ID
        [--price P [--no-consent-needed]] [--plan MONTHLY|BILLED_UPFRONT] [--url URL]

      renew            The current period ends now and renews (DID_RENEW).
      expire           Auto-renew off and the period ends now (EXPIRED / VOLUNTARY).
      fail-billing     Renewals fail from now on: billing retry for up to 60 days of emulator time, with the
                       app's grace period if it has one (DID_FAIL_TO_RENEW, GRACE_PERIOD_EXPIRED, EXPIRED / BILLING_RETRY).
      resolve-billing  The payment method works again; a subscription in retry renews at once (DID_RENEW / BILLING_RECOVERY).
      price-increase   A higher price (--price) that needs consent (PRICE_INCREASE / PENDING); without consent the
                       subscription lapses at its next renewal (EXPIRED / PRICE_INCREASE).
      consent-price-increase  The customer agrees (PRICE_INCREASE / ACCEPTED); renewals charge the new price.
      --no-consent-needed  With price-increase: an increase Apple only announces (PRICE_INCREASE / ACCEPTED at once).
      billing-plan     How the subscription renews after its current commitment or period (--plan): MONTHLY, a new
                       12-month commitment paid monthly, or BILLED_UPFRONT (renewalBillingPlanType in renewal info).
    """
    let client: AdminClient
    let action: Action
    let id: String
    let price: String?
    let noConsentNeeded: Bool
    let plan: String?

    init(_ arguments: inout Arguments) throws {
        client = try AdminClient(url: try emulatorURL(&arguments), bearer: emulatorToken())
        price = try arguments.option("price")
        plan = try arguments.option("plan")
        noConsentNeeded = arguments.flag("no-consent-needed")
        let words = try arguments.positionals()
        guard words.count == 2, let action = Action(rawValue: words[0]) else {
            throw UsageError(description: "give one of \(Action.allCases.map(\.rawValue).joined(separator: ", ")) and an original transaction id")
        }
        if action == .priceIncrease, price == nil { throw UsageError(description: "price-increase needs --price") }
        if noConsentNeeded, action != .priceIncrease { throw UsageError(description: "--no-consent-needed goes with price-increase") }
        if (action == .billingPlan) != (plan != nil) { throw UsageError(description: "billing-plan goes with --plan MONTHLY|BILLED_UPFRONT") }
        self.action = action
        id = words[1]
    }

    func run() async throws {
        var query = action == .priceIncrease ? "?price=" + (price ?? "") + (noConsentNeeded ? "&consent=none" : "") : ""
        if let plan { query = "?plan=" + plan }
        try await client.sendAndPrint("POST", "/admin/v1/subscriptions/\(id)/\(action.path)" + query)
    }
}

/// `storekeeper appstore refund TRANSACTION_ID [--reason 0|1] [--reverse]`
struct RefundCommand: Command {
    static let abstract = "Refund a transaction as Apple would (REFUND), or reverse a refund (REFUND_REVERSED)."
    static let help = """
    TRANSACTION_ID [--reason 0|1] [--percentage N] [--reverse | --request REASON | --decline] [--url URL]

      --reason 1        Refunded because of an issue in the app (cancellation_reason 1); default 0, other reasons.
      --percentage N    Refund part of the price: N milliunits of the whole, 1…99999 (50000 is half): REFUND_PRORATED
                        with revocationPercentage N. Default: all of it (REFUND_FULL, 100000).
      --reverse         Undo an earlier refund (REFUND_REVERSED).
      --request REASON  The customer asks for a refund (UNINTENDED_PURCHASE, FULFILLMENT_ISSUE, UNSATISFIED_WITH_PURCHASE,
                        LEGAL, OTHER): Apple sends CONSUMPTION_REQUEST and waits for the developer's consumption data.
      --decline         Apple declines the request (REFUND_DECLINED).
    """
    let client: AdminClient
    let id: String
    let action: String

    init(_ arguments: inout Arguments) throws {
        client = try AdminClient(url: try emulatorURL(&arguments), bearer: emulatorToken())
        let reason = try arguments.option("reason") ?? "0"
        guard reason == "0" || reason == "1" else { throw UsageError(description: "--reason is 0 or 1") }
        let reverse = arguments.flag("reverse"), decline = arguments.flag("decline")
        let request = try arguments.option("request")
        let percentage = try arguments.option("percentage")
        guard [reverse, decline, request != nil].filter({ $0 }).count <= 1 else {
            throw UsageError(description: "give at most one of --reverse, --request, --decline")
        }
        if let percentage, Int(percentage).map({ (1...100_000).contains($0) }) != true || reverse || decline || request != nil {
            throw UsageError(description: "--percentage is 1…100000 and goes with a refund")
        }
        if reverse { action = "reverse-refund" } else if decline { action = "decline-refund" } else if let request {
            action = "refund-request?reason=" + request
        } else {
            action = "refund?reason=" + reason + (percentage.map { "&percentage=" + $0 } ?? "")
        }
        id = try arguments.single("TRANSACTION_ID")
    }

    func run() async throws { try await client.sendAndPrint("POST", "/admin/v1/transactions/\(id)/" + action) }
}

/// `storekeeper appstore grace-period --app BUNDLE --days 3|16|28|none`
struct GracePeriodCommand: Command {
    static let abstract = "Turn an app's billing grace period on (3, 16 or 28 days of subscription time) or off."
    static let help = "--app BUNDLE --days 3|16|28|none [--url URL]"
    let client: AdminClient
    let app: String
    let days: Int?

    init(_ arguments: inout Arguments) throws {
        client = try AdminClient(url: try emulatorURL(&arguments), bearer: emulatorToken())
        guard let app = try arguments.option("app"), let text = try arguments.option("days") else {
            throw UsageError(description: "--app and --days are required")
        }
        guard text == "none" || ["3", "16", "28"].contains(text) else { throw UsageError(description: "--days is 3, 16, 28 or none") }
        self.app = app
        days = Int(text)
    }

    func run() async throws {
        try await client.sendAndPrint("PUT", "/admin/v1/apps/\(app)/grace-period", json: ["days": days.map { $0 as Any } ?? NSNull()])
    }
}

/// `storekeeper appstore tester family EMAIL --family NAME | --leave`
struct TesterFamilyCommand: Command {
    static let abstract = "Put a tester in a Family Sharing group (shareable purchases are shared both ways) or take them out (REVOKE)."
    static let help = "EMAIL (--family NAME | --leave) [--url URL]"
    let client: AdminClient
    let email: String
    let family: String?

    init(_ arguments: inout Arguments) throws {
        client = try AdminClient(url: try emulatorURL(&arguments), bearer: emulatorToken())
        let name = try arguments.option("family")
        let leave = arguments.flag("leave")
        guard (name != nil) != leave else { throw UsageError(description: "give --family NAME or --leave") }
        family = name
        email = try arguments.single("EMAIL")
    }

    func run() async throws {
        try await client.sendAndPrint("PUT", "/admin/v1/accounts/\(email)/family", json: ["family": family.map { $0 as Any } ?? NSNull()])
    }
}

/// `storekeeper appstore win-back --app BUNDLE --account EMAIL --product ID --offer OFFER_ID`
struct WinBackCommand: Command {
    static let abstract = "Redeem a win-back offer for a lapsed subscriber, as the App Store's streamlined purchase does."
    static let help = """
    --app BUNDLE --account EMAIL --product ID --offer OFFER_ID [--url URL]

    The offer is one of the product's winbackOffers in its .storekit file (by offerID). The customer must have paid
    for a subscription of the group that has lapsed, and redeems each offer once (else ineligibleForOffer). The
    subscription starts again with the offer (offerType 4, SUBSCRIBED / RESUBSCRIBE). In the app, the same offer is
    a purchase option: POST /device/v1/payments with "winBackOfferId".
    """
    let redemption: OfferRedemption

    init(_ arguments: inout Arguments) throws { redemption = try OfferRedemption(&arguments, path: "/admin/v1/win-back-offers/redeem") }

    func run() async throws { try await redemption.run() }
}

/// `storekeeper appstore redeem-code --app BUNDLE --account EMAIL --product ID --offer REFERENCE`
struct RedeemCodeCommand: Command {
    static let abstract = "Redeem a subscription offer code for a customer, as the App Store's redemption sheet does."
    static let help = """
    --app BUNDLE --account EMAIL --product ID --offer REFERENCE [--url URL]

    The offer is one of the product's codeOffers in its .storekit file (by referenceName). The subscription starts or
    changes with the offer (offerType 3): SUBSCRIBED for a new or lapsed subscriber, OFFER_REDEEMED for an active one.
    """
    let redemption: OfferRedemption

    init(_ arguments: inout Arguments) throws { redemption = try OfferRedemption(&arguments, path: "/admin/v1/offer-codes/redeem") }

    func run() async throws { try await redemption.run() }
}

/// `--app --account --product --offer`, posted to an admin route that redeems an offer in the App Store.
struct OfferRedemption {
    let client: AdminClient
    let path: String
    let body: [String: String]

    init(_ arguments: inout Arguments, path: String) throws {
        client = try AdminClient(url: try emulatorURL(&arguments), bearer: emulatorToken())
        guard let app = try arguments.option("app"), let account = try arguments.option("account"), let product = try arguments.option("product"),
              let offer = try arguments.option("offer") else { throw UsageError(description: "--app, --account, --product and --offer are required") }
        self.path = path
        body = ["app": app, "account": account, "product": product, "offer": offer]
    }

    func run() async throws { try await client.sendAndPrint("POST", path, json: body) }
}

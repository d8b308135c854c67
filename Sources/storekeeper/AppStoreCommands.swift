import Foundation

/// `storekeeper appstore tester add EMAIL`
struct TesterAddCommand: Command {
    static let abstract = "Add a sandbox tester (or, with --production, a production account)."
    static let help = """
    EMAIL [--production] [--storefront USA] [--locale en_US] [--renewal-rate RATE] [--ask-to-buy] [--xcode] [--url URL]

    OPTIONS:
      --renewal-rate RATE  One of MONTHLY_RENEWAL_EVERY_THREE_MINUTES, …_FIVE_MINUTES (default), …_FIFTEEN_MINUTES,
                           …_THIRTY_MINUTES, …_ONE_HOUR, or TESTFLIGHT_DAILY (a TestFlight build: every
                           subscription renews daily, six times, then auto-renew turns off).
      --ask-to-buy         Purchases wait for a parent's approval.
      --xcode              A tester of Xcode's StoreKit Testing: its signed data is signed by a self-signed
                           "StoreKit Testing in Xcode" certificate with environment Xcode, as Xcode's is
                           (export it with 'ca export --xcode'); the Server API does not know its transactions.
      --url URL            The emulator (default http://127.0.0.1:8010).
    """
    let client: AdminClient
    let body: [String: Any]

    init(_ arguments: inout Arguments) throws {
        client = try AdminClient(url: try emulatorURL(&arguments), bearer: emulatorToken())
        var body: [String: Any] = ["environment": arguments.flag("production") ? "production" : "sandbox"]
        if let storefront = try arguments.option("storefront") { body["storefront"] = storefront }
        if let locale = try arguments.option("locale") { body["locale"] = locale }
        if let rate = try arguments.option("renewal-rate") { body["renewalRate"] = rate }
        body["askToBuy"] = arguments.flag("ask-to-buy")
        if arguments.flag("xcode") { body["xcode"] = true }
        let rest = try arguments.positionals()
        guard rest.count == 1 else { throw UsageError(description: "give one EMAIL") }
        body["email"] = rest[0]
        self.body = body
    }

    func run() async throws { try await client.sendAndPrint("POST", "/admin/v1/accounts", json: body) }
}

/// `storekeeper appstore buy`
struct BuyCommand: Command {
    static let abstract = "Buy a product as a device would; prints the transaction and the new app receipt."
    static let help = """
    --app BUNDLE --product ID --account EMAIL [--device UUID] [--quantity N] [--username NAME] [--simulate cancel|fail] [--url URL]

    Prints one JSON object with transaction_id, original_transaction_id, environment, state, device,
    receipt (the Base64 app receipt after the purchase) and transaction_receipt (iOS 6 style).
    """
    let client: AdminClient
    let body: [String: Any]

    init(_ arguments: inout Arguments) throws {
        client = try AdminClient(url: try emulatorURL(&arguments), bearer: emulatorToken())
        guard let app = try arguments.option("app"), let product = try arguments.option("product"), let account = try arguments.option("account") else {
            throw UsageError(description: "--app, --product and --account are required")
        }
        var body: [String: Any] = ["app": app, "product": product, "account": account]
        if let device = try arguments.option("device") { body["device"] = device }
        if let text = try arguments.option("quantity") {
            guard let quantity = Int(text) else { throw UsageError(description: "--quantity must be a number") }
            body["quantity"] = quantity
        }
        if let username = try arguments.option("username") { body["applicationUsername"] = username }
        if let simulate = try arguments.option("simulate") { body["simulate"] = simulate }
        self.body = body
    }

    func run() async throws { try await client.sendAndPrint("POST", "/admin/v1/purchases", json: body) }
}

/// `storekeeper appstore finish`
struct FinishCommand: Command {
    static let abstract = "Finish a transaction (finished consumables leave the receipt)."
    static let help = "TRANSACTION_ID [--url URL]"
    let client: AdminClient
    let id: String

    init(_ arguments: inout Arguments) throws {
        client = try AdminClient(url: try emulatorURL(&arguments), bearer: emulatorToken())
        id = try arguments.single("TRANSACTION_ID")
    }

    func run() async throws { try await client.sendAndPrint("POST", "/admin/v1/transactions/\(id)/finish") }
}

/// `storekeeper appstore restore`
struct RestoreCommand: Command {
    static let abstract = "Restore completed transactions (non-consumables and auto-renewables) on a device."
    static let help = "--app BUNDLE --account EMAIL [--device UUID] [--url URL]"
    let client: AdminClient
    let body: [String: Any]

    init(_ arguments: inout Arguments) throws {
        client = try AdminClient(url: try emulatorURL(&arguments), bearer: emulatorToken())
        guard let app = try arguments.option("app"), let account = try arguments.option("account") else {
            throw UsageError(description: "--app and --account are required")
        }
        var body: [String: Any] = ["app": app, "account": account]
        if let device = try arguments.option("device") { body["device"] = device }
        self.body = body
    }

    func run() async throws { try await client.sendAndPrint("POST", "/admin/v1/restore", json: body) }
}

/// `storekeeper appstore time advance DURATION`
struct TimeAdvanceCommand: Command {
    static let abstract = "Move the emulator clock forward (renewals fall due); e.g. 5m, 1h30m, 2d."
    static let help = "DURATION [--url URL]"
    let client: AdminClient
    let duration: String

    init(_ arguments: inout Arguments) throws {
        client = try AdminClient(url: try emulatorURL(&arguments), bearer: emulatorToken())
        duration = try arguments.single("DURATION")
    }

    func run() async throws { try await client.sendAndPrint("POST", "/admin/v1/time", json: ["advance": duration]) }
}

/// `storekeeper appstore time set DATE`
struct TimeSetCommand: Command {
    static let abstract = "Set the emulator clock to an RFC 3339 date or Unix milliseconds."
    static let help = "DATE [--url URL]"
    let client: AdminClient
    let date: String

    init(_ arguments: inout Arguments) throws {
        client = try AdminClient(url: try emulatorURL(&arguments), bearer: emulatorToken())
        date = try arguments.single("DATE")
    }

    func run() async throws { try await client.sendAndPrint("POST", "/admin/v1/time", json: ["set": date]) }
}

/// `storekeeper appstore time show`
struct TimeShowCommand: Command {
    static let abstract = "Print the emulator clock."
    static let help = "[--url URL]"
    let client: AdminClient
    init(_ arguments: inout Arguments) throws { client = try AdminClient(url: try emulatorURL(&arguments), bearer: emulatorToken()) }
    func run() async throws { try await client.sendAndPrint("GET", "/admin/v1/time") }
}

/// `storekeeper appstore fault add`
struct FaultAddCommand: Command {
    static let abstract = "Make an endpoint misbehave: Apple statuses, HTTP errors, HTML, drops, hangs, latency."
    static let help = """
    --endpoint NAME [--environment sandbox|production] [--status CODE | --http CODE | --html | --drop | --hang] [--latency 3s-6s] [--for DURATION] [--url URL]

    ENDPOINTS: verifyReceipt, products, payments, transactions, finish, restore, receipt, * (all).
      --status CODE   verifyReceipt answers 21002, 21005, 21009, 21010 or 21100–21199 (with is_retryable).
      --http CODE     Answer HTTP CODE (e.g. 503).
      --html          Answer an HTML error page with HTTP 200.
      --drop          Close the connection without answering.
      --hang          Never answer.
      --latency D     Delay every answer: a duration (500ms) or a range (3s-6s).
      --for DURATION  Remove the fault after DURATION of emulator time.
    """
    let client: AdminClient
    let body: [String: Any]

    init(_ arguments: inout Arguments) throws {
        client = try AdminClient(url: try emulatorURL(&arguments), bearer: emulatorToken())
        guard let endpoint = try arguments.option("endpoint") else { throw UsageError(description: "--endpoint is required") }
        var body: [String: Any] = ["endpoint": endpoint]
        if let environment = try arguments.option("environment") { body["environment"] = environment }
        if let status = try arguments.option("status") {
            guard let code = Int(status) else { throw UsageError(description: "--status must be a number") }
            body["status"] = code
        }
        if let http = try arguments.option("http") {
            guard let code = Int(http) else { throw UsageError(description: "--http must be a number") }
            body["http"] = code
        }
        if arguments.flag("html") { body["html"] = true }
        if arguments.flag("drop") { body["drop"] = true }
        if arguments.flag("hang") { body["hang"] = true }
        if let latency = try arguments.option("latency") { body["latency"] = latency }
        if let duration = try arguments.option("for") { body["duration"] = duration }
        self.body = body
    }

    func run() async throws { try await client.sendAndPrint("POST", "/admin/v1/faults", json: body) }
}

/// `storekeeper appstore fault clear`
struct FaultClearCommand: Command {
    static let abstract = "Remove all faults (or those of one endpoint)."
    static let help = "[--endpoint NAME] [--url URL]"
    let client: AdminClient
    let endpoint: String?

    init(_ arguments: inout Arguments) throws {
        client = try AdminClient(url: try emulatorURL(&arguments), bearer: emulatorToken())
        endpoint = try arguments.option("endpoint")
    }

    func run() async throws {
        let query = endpoint.map { "?endpoint=" + ($0.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? $0) } ?? ""
        try await client.sendAndPrint("DELETE", "/admin/v1/faults" + query)
    }
}

/// `storekeeper appstore fault list`
struct FaultListCommand: Command {
    static let abstract = "List the faults in force."
    static let help = "[--url URL]"
    let client: AdminClient
    init(_ arguments: inout Arguments) throws { client = try AdminClient(url: try emulatorURL(&arguments), bearer: emulatorToken()) }
    func run() async throws { try await client.sendAndPrint("GET", "/admin/v1/faults") }
}

/// `storekeeper appstore ca export`
struct CAExportCommand: Command {
    static let abstract = "Write the emulator's root certificate as PEM (what a backend must trust)."
    static let help = """
    [--jws | --tls | --xcode | --xcode-receipts] [--chain] [--output FILE] [--url URL]

      --jws          The ECC root that signs StoreKit 2 data (signed transactions, notifications) instead of
                     the RSA root of receipts; Apple likewise has two (Apple Inc. Root, Apple Root CA - G3).
      --tls          The root of the TLS certificate the emulator serves Apple's host names with: what
                     SSL_CERT_FILE, REQUESTS_CA_BUNDLE, NODE_EXTRA_CA_CERTS or a Java trust store must hold.
      --xcode        The self-signed certificate of Xcode testers' signed data (Xcode's StoreKitTestCertificate's role).
      --xcode-receipts  The self-signed RSA certificate (CN=StoreKit) that signs Xcode testers' receipts.
      --chain        Also write the intermediate (needed to check iOS 6 style receipts, which embed only the leaf).
      --output FILE  Write to FILE instead of standard output.
    """
    let client: AdminClient
    let chain: Bool
    let jws: Bool
    let tls: Bool
    let xcode: Bool
    let xcodeReceipts: Bool
    let output: String?

    init(_ arguments: inout Arguments) throws {
        client = try AdminClient(url: try emulatorURL(&arguments), bearer: emulatorToken())
        chain = arguments.flag("chain")
        jws = arguments.flag("jws")
        tls = arguments.flag("tls")
        xcode = arguments.flag("xcode")
        xcodeReceipts = arguments.flag("xcode-receipts")
        output = try arguments.option("output")
        if tls && (jws || chain) { throw UsageError(description: "--tls stands alone (the TLS root has no intermediate)") }
    }

    func run() async throws {
        let query = [chain ? "chain=true" : nil, jws ? "jws=true" : nil, tls ? "tls=true" : nil, xcode ? "xcode=true" : nil,
                     xcodeReceipts ? "xcode=receipts" : nil]
            .compactMap { $0 }.joined(separator: "&")
        let data = try await client.send("GET", "/admin/v1/ca" + (query.isEmpty ? "" : "?" + query))
        if let output {
            try data.write(to: URL(fileURLWithPath: output))
        } else {
            FileHandle.standardOutput.write(data)
        }
    }
}

/// `storekeeper appstore test-session`
struct TestSessionCommand: Command {
    static let abstract = "Change an app's StoreKit Testing switches (SKTestSession's), or show them."
    static let help = """
    --app BUNDLE [--ask-to-buy on|off] [--fail-transactions on|off] [--interrupted-purchases on|off]
                 [--billing-retry on|off] [--grace-period on|off] [--time-rate N] [--url URL]

      --interrupted-purchases  Purchases wait (pending) until 'storekeeper appstore resolve TRANSACTION_ID'.
      --billing-retry          Renewals fail to bill and enter billing retry (shouldEnterBillingRetryOnRenewal).
      --grace-period           A 16-day billing grace period (scaled by the renewal rate), as Xcode's.
      --time-rate N            An SKTestSession.TimeRate raw value: 0 real time, 1–6 a day in 1 h … 1 s,
                               10–13 and 15 a month in 1 h, 30, 15, 5 min, 30 s, 1000–1005 every period in
                               15 min, 5 min, 1 min, 30 s, 10 s, 2 s (the app's sandbox subscriptions).
    """
    let client: AdminClient
    let app: String
    let change: [String: Any]

    init(_ arguments: inout Arguments) throws {
        client = try AdminClient(url: try emulatorURL(&arguments), bearer: emulatorToken())
        guard let app = try arguments.option("app") else { throw UsageError(description: "--app is required") }
        self.app = app
        var change: [String: Any] = [:]
        for (option, key) in [("ask-to-buy", "askToBuyEnabled"), ("fail-transactions", "failTransactionsEnabled"),
                              ("interrupted-purchases", "interruptedPurchasesEnabled"), ("billing-retry", "billingIssuesEnabled"),
                              ("grace-period", "billingGracePeriodEnabled")] {
            guard let value = try arguments.option(option) else { continue }
            guard value == "on" || value == "off" else { throw UsageError(description: "--\(option) is on or off") }
            change[key] = value == "on"
        }
        if let rate = try arguments.option("time-rate") {
            guard let value = Int(rate) else { throw UsageError(description: "--time-rate is a number (SKTestSession.TimeRate)") }
            change["timeRate"] = value
        }
        self.change = change
    }

    func run() async throws {
        let path = "/admin/v1/apps/\(app)/test-session"
        if change.isEmpty { try await client.sendAndPrint("GET", path) } else { try await client.sendAndPrint("PATCH", path, json: change) }
    }
}

/// `storekeeper appstore resolve`
struct ResolveCommand: Command {
    static let abstract = "Resolve an interrupted purchase: the customer acts, the purchase completes (SKTestSession.resolveIssueForTransaction)."
    static let help = "TRANSACTION_ID [--url URL]"
    let client: AdminClient
    let id: String

    init(_ arguments: inout Arguments) throws {
        client = try AdminClient(url: try emulatorURL(&arguments), bearer: emulatorToken())
        id = try arguments.single("TRANSACTION_ID")
    }

    func run() async throws { try await client.sendAndPrint("POST", "/admin/v1/transactions/\(id)/resolve") }
}

/// `storekeeper appstore delete-transactions`
struct DeleteTransactionsCommand: Command {
    static let abstract = "Forget an app's transactions as if never made (SKTestSession.deleteTransaction / clearTransactions)."
    static let help = """
    --app BUNDLE [--transaction ID | --account EMAIL] [--url URL]

    Without --transaction, the app's sandbox transactions (of one account with --account); production's are never
    cleared. A subscription's original id deletes its whole chain, a renewal's id that renewal only.
    """
    let client: AdminClient
    let app: String
    let transaction: String?
    let account: String?

    init(_ arguments: inout Arguments) throws {
        client = try AdminClient(url: try emulatorURL(&arguments), bearer: emulatorToken())
        guard let app = try arguments.option("app") else { throw UsageError(description: "--app is required") }
        self.app = app
        transaction = try arguments.option("transaction")
        account = try arguments.option("account")
        if transaction != nil && account != nil { throw UsageError(description: "--transaction and --account exclude each other") }
    }

    func run() async throws {
        var query = transaction.map { "?transaction=" + $0 } ?? ""
        if let account { query = "?account=" + (account.addingPercentEncoding(withAllowedCharacters: .urlQueryAllowed) ?? account) }
        try await client.sendAndPrint("DELETE", "/admin/v1/apps/\(app)/transactions" + query)
    }
}

/// `storekeeper appstore simulate-error`
struct SimulateErrorCommand: Command {
    static let abstract = "Make a StoreKit API of an app fail, as SKTestSession.setSimulatedError(_:forAPI:) does (or stop it)."
    static let help = """
    --app BUNDLE [--api API [--error ERROR | --off]] [--clear] [--url URL]

    APIs: loadProducts, purchase, verification, appStoreSync, subscriptionStatus, appTransaction,
    manageSubscriptions, refundRequest, offerCodeRedeem (or Xcode's names, "Load Products", …).
    ERROR is a StoreKit 2 case: StoreKitError (unknown, userCancelled, networkError, systemError,
    notAvailableInStorefront, notEntitled, unsupported), Product.PurchaseError (purchase only: invalidQuantity,
    productUnavailable, purchaseNotAllowed, ineligibleForOffer, invalidOfferIdentifier, invalidOfferPrice,
    invalidOfferSignature, missingOfferParameters), VerificationResult.VerificationError (purchase, verification,
    appTransaction: invalidSignature, …) or Transaction.RefundRequestError (refundRequest: duplicateRequest, failed).
    Without --api it prints every API's state; --clear switches them all off.
    """
    let client: AdminClient
    let app: String
    let api: String?
    let error: String?
    let off: Bool
    let clear: Bool

    init(_ arguments: inout Arguments) throws {
        client = try AdminClient(url: try emulatorURL(&arguments), bearer: emulatorToken())
        guard let app = try arguments.option("app") else { throw UsageError(description: "--app is required") }
        self.app = app
        api = try arguments.option("api")
        error = try arguments.option("error")
        off = arguments.flag("off")
        clear = arguments.flag("clear")
        if (error != nil || off) && api == nil { throw UsageError(description: "--error and --off need --api") }
        if error != nil && off { throw UsageError(description: "--error and --off exclude each other") }
        if clear && api != nil { throw UsageError(description: "--clear switches every API off; leave out --api") }
    }

    func run() async throws {
        let path = "/admin/v1/apps/\(app)/simulated-errors"
        if clear {
            try await client.sendAndPrint("DELETE", path)
        } else if let api {
            var body: [String: Any] = ["api": api, "enabled": !off]
            if let error { body["error"] = error }
            try await client.sendAndPrint("PUT", path, json: body)
        } else {
            try await client.sendAndPrint("GET", path)
        }
    }
}

/// `storekeeper appstore ca revoke`
struct CARevokeCommand: Command {
    static let abstract = "Mark a certificate of the JWS chain revoked (or good again) for the OCSP responder it names."
    static let help = """
    leaf|intermediate [--undo] [--url URL]

    Apple's SignedDataVerifier with online checks asks the responder about the intermediate and the leaf;
    once one is revoked it refuses every signed transaction, renewal and notification. Prints what is revoked.
    """
    let client: AdminClient
    let certificate: String
    let undo: Bool

    init(_ arguments: inout Arguments) throws {
        client = try AdminClient(url: try emulatorURL(&arguments), bearer: emulatorToken())
        undo = arguments.flag("undo")
        let certificate = try arguments.single("certificate (leaf or intermediate)")
        guard ["leaf", "intermediate"].contains(certificate) else { throw UsageError(description: "the certificate is leaf or intermediate") }
        self.certificate = certificate
    }

    func run() async throws {
        try await client.sendAndPrint(undo ? "DELETE" : "POST", "/admin/v1/ca/revocations?certificate=" + certificate)
    }
}

/// `storekeeper appstore key create --app BUNDLE`
struct ServerAPIKeyCreateCommand: Command {
    static let abstract = "Create an App Store Server API key for an app (App Store Connect's In-App Purchase key)."
    static let help = """
    --app BUNDLE [--url URL]

    Prints {"keyId", "issuerId", "bundleId", "privateKey"}: sign ES256 bearer tokens with privateKey (PEM),
    kid keyId, iss issuerId, aud appstoreconnect-v1, bid BUNDLE, as Apple's app-store-server-library does,
    and call {URL}/sandbox/inApps/... or {URL}/production/inApps/.... The private key is shown only once.
    """
    let client: AdminClient
    let app: String

    init(_ arguments: inout Arguments) throws {
        client = try AdminClient(url: try emulatorURL(&arguments), bearer: emulatorToken())
        guard let app = try arguments.option("app") else { throw UsageError(description: "--app is required") }
        self.app = app
    }

    func run() async throws {
        try await client.sendAndPrint("POST", "/admin/v1/apps/\(app.addingPercentEncoding(withAllowedCharacters: .urlPathAllowed) ?? app)/api-keys")
    }
}

/// `storekeeper appstore notifications set --app BUNDLE [--production-url URL] [--sandbox-url URL]`
struct NotificationURLCommand: Command {
    static let abstract = "Set where an app's App Store Server Notifications V2 go (as in App Store Connect)."
    static let help = """
    --app BUNDLE [--production-url URL] [--sandbox-url URL] [--url EMULATOR]

    The emulator POSTs {"signedPayload": JWS} there for purchases (ONE_TIME_CHARGE, SUBSCRIBED), renewals
    (DID_RENEW), refunds (REFUND), auto-renew changes and expiries; sandbox sends once, production retries
    after 1, 12, 24, 48 and 72 hours of emulator time. Without a URL an environment gets no notifications.
    """
    let client: AdminClient
    let app: String
    let production: String?
    let sandbox: String?

    init(_ arguments: inout Arguments) throws {
        client = try AdminClient(url: try emulatorURL(&arguments), bearer: emulatorToken())
        guard let app = try arguments.option("app") else { throw UsageError(description: "--app is required") }
        self.app = app
        production = try arguments.option("production-url")
        sandbox = try arguments.option("sandbox-url")
    }

    func run() async throws {
        var body: [String: Any] = [:]
        if let production { body["production"] = production }
        if let sandbox { body["sandbox"] = sandbox }
        try await client.sendAndPrint("PUT", "/admin/v1/apps/\(app.addingPercentEncoding(withAllowedCharacters: .urlPathAllowed) ?? app)/notifications", json: body)
    }
}

/// `storekeeper appstore catalog export`
struct CatalogExportCommand: Command {
    static let abstract = "Write an app's catalog as an Xcode .storekit file (products, groups, offers, settings), or as Storekeeper JSON."
    static let help = """
    --app BUNDLE_ID [--storekit] [--output FILE] [--url URL]

      --storekit   An Xcode StoreKit configuration file (version 4.0) that Xcode and `appstore serve --catalog B=FILE` read;
                   without it, the app as Storekeeper's catalog JSON.
      --output     Write to FILE instead of standard output.
    """
    let client: AdminClient
    let app: String
    let storekit: Bool
    let output: String?

    init(_ arguments: inout Arguments) throws {
        client = try AdminClient(url: try emulatorURL(&arguments), bearer: emulatorToken())
        guard let app = try arguments.option("app") else { throw UsageError(description: "give --app BUNDLE_ID") }
        self.app = app
        storekit = arguments.flag("storekit")
        output = try arguments.option("output")
    }

    func run() async throws {
        let data = try await client.send("GET", "/admin/v1/apps/\(pathSegment(app))" + (storekit ? "/storekit" : ""))
        if let output {
            try data.write(to: URL(fileURLWithPath: output))
        } else {
            FileHandle.standardOutput.write(data)
            print()
        }
    }
}

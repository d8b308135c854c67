import AppStoreCrypto
import AppStoreModels
import Foundation

extension AppStoreEmulator {
    /// Answers `POST /verifyReceipt` of one environment exactly as Apple does: HTTP 200 with the
    /// outcome in `status`. Returns the JSON body.
    public func verifyReceipt(body: Data, environment: AppStoreEnvironment) async -> Data {
        let (answer, aftermath) = verifyReceiptNow(body: body, environment: environment)
        return await Self.answer(answer, after: aftermath, environment: environment)
    }

    /// A verification's answer once what it left to do has completed, or Apple's internal data access error if that failed.
    static func answer(_ answer: Data, after aftermath: Aftermath?, environment: AppStoreEnvironment) async -> Data {
        do {
            try await aftermath?.complete()
            return answer
        } catch {
            return Data(VerifyReceiptResponse(status: VerifyReceiptStatus.internalDataAccessError, environment: environment).jsonBytes())
        }
    }

    /// verifyReceipt without waiting: the answer, and what must complete before it is given out (the renewals its
    /// read found, persisted; nil or empty for nearly every call). It computes over memory only, so a transport may
    /// run it on its own thread.
    func verifyReceiptNow(body: Data, environment: AppStoreEnvironment) -> (Data, Aftermath?) {
        func answer(_ response: VerifyReceiptResponse) -> Data { Data(response.jsonBytes()) }
        func status(_ code: Int, exception: String? = nil) -> (Data, Aftermath?) {
            (answer(VerifyReceiptResponse(status: code, environment: environment, exception: exception)), nil)
        }

        guard let request = VerifyReceiptRequest(json: body) else {
            return status(VerifyReceiptStatus.unreadableRequest)
        }
        guard let text = request.receiptData, let bytes = ReceiptDecoder.base64Decode(text) else {
            return status(VerifyReceiptStatus.malformedReceipt)
        }
        let decoded: DecodedReceipt
        do {
            decoded = try ReceiptDecoder.decode(bytes)
        } catch {
            return status(VerifyReceiptStatus.malformedReceipt)
        }
        switch decoded {
        case .app(let receipt, let signedData):
            guard isSignedByUs(signedData) else { return status(VerifyReceiptStatus.notAuthenticated) }
            do {
                let (response, aftermath) = try verifyAppReceipt(receipt, request: request, environment: environment)
                return (answer(response), aftermath)
            } catch {
                return status(VerifyReceiptStatus.internalDataAccessError)
            }
        case .transaction(let legacy):
            guard legacy.certificate == authority.leaf.der,
                  authority.leafPublicKey.isValidSignature(legacy.signature, for: [legacy.signatureVersion] + legacy.purchaseInfoBytes, digest: .sha1) else {
                return status(VerifyReceiptStatus.notAuthenticated)
            }
            do {
                return try verifyTransactionReceipt(legacy, request: request, environment: environment)
            } catch {
                return status(VerifyReceiptStatus.internalDataAccessError)
            }
        }
    }

    /// Whether the receipt carries our chain and a valid signature by our leaf.
    func isSignedByUs(_ signedData: SignedData) -> Bool {
        let ours = authority.chain
        // Byte comparison (memcmp), in any order: hashing ~3 KB of certificates per request is measurably slower.
        if signedData.certificates.count == ours.count,
           signedData.certificates.allSatisfy({ certificate in ours.contains { $0.der.hasSameBytes(as: certificate) } }) {
            return (try? signedData.verifySignature(with: authority.leafPublicKey)) != nil
        }
        // Foreign chains are checked properly (and fail unless they chain to our root).
        let verifier = ChainVerifier(roots: [authority.root])
        return (try? signedData.verify(with: verifier, at: clock.now())) != nil
    }

    func verifyAppReceipt(_ receipt: AppReceipt, request: VerifyReceiptRequest, environment: AppStoreEnvironment) throws -> (VerifyReceiptResponse, Aftermath?) {
        guard let receiptEnvironment = receipt.receiptType.environment else {
            return (VerifyReceiptResponse(status: VerifyReceiptStatus.notAuthenticated, environment: environment), nil)
        }
        // Under the state's lock only what needs the state: the answer's rendering (a thousand purchases of a receipt,
        // a subscriber's latest transactions) is made after it, so verifications of different receipts do not wait on
        // each other for it.
        let (built, aftermath) = try readNow { state, now -> LockedAnswer in
            func refused(_ status: Int) -> LockedAnswer {
                LockedAnswer(response: VerifyReceiptResponse(status: status, environment: environment), requestDate: now)
            }
            let app = state.apps[receipt.bundleId]
            // Looked up in place: a receipt of a thousand purchases copies no product and no transaction it does not answer with,
            // and is searched only for the app's products of the type (usually none or a few), one hash per purchase.
            func receiptHas(_ type: ProductType) -> Bool {
                // Most apps have no product of the type asked about (a store of coins has no subscription): no set, no scan.
                guard app?.products.contains(where: { $0.type == type }) == true else { return false }
                var ids = Set<String>()
                for product in app?.products ?? [] where product.type == type { ids.insert(product.productId) }
                return !ids.isEmpty && receipt.inApp.contains { ids.contains($0.productId) }
            }
            if receiptEnvironment != environment {
                if environment == .production, state.quirks.sandboxConsumableAnswers21002InProduction, receiptHas(.consumable) {
                    return refused(VerifyReceiptStatus.malformedReceipt)
                }
                let code = environment == .production ? VerifyReceiptStatus.sandboxReceiptInProduction : VerifyReceiptStatus.productionReceiptInSandbox
                return refused(code)
            }
            guard let app else { return refused(VerifyReceiptStatus.notAuthenticated) }
            let buyer = receipt.inApp.lazy.compactMap { state.transactions[$0.transactionId]?.accountEmail }.first
            let account = buyer.flatMap { state.accounts[$0.lowercased()] }
            if let account, account.deleted {
                return refused(VerifyReceiptStatus.accountNotFound)
            }
            let hasSubscriptions = receiptHas(.autoRenewable) || account.map { account in
                state.hasPurchasedSubscription(account: account.email, bundle: app.bundleId, environment: environment)
            } == true
            if let password = request.password, password != app.sharedSecret {
                return refused(VerifyReceiptStatus.sharedSecretMismatch)
            }
            if hasSubscriptions && request.password == nil {
                return refused(VerifyReceiptStatus.sharedSecretMismatch)
            }
            var response = VerifyReceiptResponse(status: VerifyReceiptStatus.valid, environment: environment)
            guard hasSubscriptions, let account else { return LockedAnswer(response: response, requestDate: now) }
            let records = state.transactions(account: account.email, bundle: app.bundleId, environment: environment)
            var latest = records.filter(\.belongsInReceipt)
            if request.excludeOldTransactions == true {
                var newest: [String: TransactionRecord] = [:]
                for record in latest where record.productType == .autoRenewable {
                    if let current = newest[record.originalId], current.purchaseDate >= record.purchaseDate { continue }
                    newest[record.originalId] = record
                }
                latest = Array(newest.values)
            }
            latest.sort { ($0.purchaseDate, $0.id) > ($1.purchaseDate, $1.id) }
            response.pendingRenewalInfo = state.chains.values
                .filter { $0.accountEmail.lowercased() == account.email.lowercased() && $0.bundleId == app.bundleId && $0.environment == environment }
                .sorted { $0.originalTransactionId < $1.originalTransactionId }
                .map(AppStoreEmulator.pendingRenewalInfo)
            let deviceId = records.last?.deviceId ?? ""
            let device = state.devices[deviceId] ?? Device(id: deviceId, accountEmail: account.email)
            let fresh = self.makeReceipt(app: app, account: account, device: device, records: records, now: now)
            return LockedAnswer(response: response, requestDate: now, subscription: (fresh, latest))
        }
        var response = built.response
        if response.status == VerifyReceiptStatus.valid { response.receipt = ReceiptInfo(receipt, requestDate: built.requestDate) }
        if let (fresh, latest) = built.subscription {
            // The subscription's entries are rendered here, after the lock, like the receipt's own.
            response.latestReceiptInfo = latest.map(\.latestReceiptInfo)
            do {
                response.latestReceipt = Data(try sign(fresh)).base64EncodedString()
            } catch {
                // The renewals the read found are still stored and announced before this answer goes.
                return (VerifyReceiptResponse(status: VerifyReceiptStatus.internalDataAccessError, environment: environment), aftermath)
            }
        }
        return (response, aftermath)
    }

    /// What verifyReceipt learns under the state's lock: the answer's status, when it was asked, and for a subscriber the
    /// fresh receipt and the transactions of `latest_receipt_info` (rendered after the lock).
    private struct LockedAnswer: Sendable {
        var response: VerifyReceiptResponse
        var requestDate: Date
        var subscription: (fresh: AppReceipt, latest: [TransactionRecord])?
    }

    func verifyTransactionReceipt(_ legacy: LegacyTransactionReceipt, request: VerifyReceiptRequest, environment: AppStoreEnvironment) throws -> (Data, Aftermath?) {
        if legacy.environment != environment {
            let code = environment == .production ? VerifyReceiptStatus.sandboxReceiptInProduction : VerifyReceiptStatus.productionReceiptInSandbox
            return (Data(VerifyReceiptResponse(status: code, environment: environment).jsonBytes()), nil)
        }
        struct Answer: Sendable {
            var status: Int
            var sandbox = false
            var receipt: [String: String]?
            var latestKey: String?
            var latest: [String: String]?
            var renewed: TransactionRecord?
            var app: CatalogApp?
        }
        let (answer, aftermath) = try readNow { state, now -> Answer in
            guard let id = legacy.purchaseInfo["transaction-id"], let record = state.transactions[id], let app = state.apps[record.bundleId] else {
                return Answer(status: VerifyReceiptStatus.notAuthenticated)
            }
            if state.accounts[record.accountEmail.lowercased()]?.deleted == true {
                return Answer(status: VerifyReceiptStatus.accountNotFound)
            }
            if let password = request.password, password != app.sharedSecret {
                return Answer(status: VerifyReceiptStatus.sharedSecretMismatch)
            }
            var answer = Answer(status: VerifyReceiptStatus.valid, sandbox: record.environment == .sandbox, receipt: legacy.receiptJSON)
            guard record.productType == .autoRenewable else { return answer }
            if request.password == nil { return Answer(status: VerifyReceiptStatus.sharedSecretMismatch) }
            let latest = state.chains[record.originalId].flatMap { state.transactions[$0.latestTransactionId] } ?? record
            answer.latest = Dictionary(AppStoreEmulator.legacyPurchaseInfo(latest, app: app).map { ($0.0.replacingOccurrences(of: "-", with: "_"), $0.1) },
                                       uniquingKeysWith: { $1 })
            if let expires = latest.expiresDate, expires <= now || latest.cancellationDate != nil {
                answer.status = VerifyReceiptStatus.subscriptionExpired
                answer.latestKey = "latest_expired_receipt_info"
                return answer
            }
            answer.latestKey = "latest_receipt_info"
            answer.renewed = latest
            answer.app = app
            return answer
        }
        var body: [String: Any] = ["status": answer.status]
        if answer.sandbox { body["environment"] = "Sandbox" }
        if let receipt = answer.receipt { body["receipt"] = receipt }
        if let key = answer.latestKey, let latest = answer.latest { body[key] = latest }
        do {
            if let latest = answer.renewed, let app = answer.app {
                body["latest_receipt"] = Data(try legacyReceipt(for: latest, app: app)).base64EncodedString()
            }
            return (try JSONSerialization.data(withJSONObject: body, options: [.sortedKeys, .withoutEscapingSlashes]), aftermath)
        } catch {
            // As for app receipts: what the read found is still stored before this answer goes.
            return (Data(VerifyReceiptResponse(status: VerifyReceiptStatus.internalDataAccessError, environment: environment).jsonBytes()), aftermath)
        }
    }
}

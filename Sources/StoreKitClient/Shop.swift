import Foundation

/// Thrown by the crash-injection hook: the process "dies" right after writing `state`.
public struct InjectedCrash: Error, Sendable, Equatable {
    public var after: OrderState
    public init(after: OrderState) { self.after = after }
}

/// The device's purchase flow of seed 003: every order goes created → paid → verified by the server →
/// delivered → finished, each step written to the journal before the next. The transaction is finished
/// with the App Store only after the server confirmed it and the content was delivered, so a crash or a
/// network failure at any step loses nothing and never delivers twice; `resume()` at launch carries every
/// open order on from where it stopped.
public final class Shop: Sendable {
    public let appStore: AppStoreConnection
    public let server: PurchaseServerConnection
    public let journal: OrderJournal
    /// What the device sends the server to prove a purchase.
    public enum Proof: Sendable {
        /// The StoreKit 2 signed transaction (checked locally by the server, no call to Apple).
        case signedTransaction
        /// The app receipt (the server verifies it with verifyReceipt).
        case receipt
    }

    public let proof: Proof
    /// For tests: throw `InjectedCrash` right after writing this state.
    let crashAfter: OrderState?

    public init(appStore: AppStoreConnection, server: PurchaseServerConnection, journal: OrderJournal, proof: Proof = .signedTransaction,
                crashAfter: OrderState? = nil) {
        self.appStore = appStore
        self.server = server
        self.journal = journal
        self.proof = proof
        self.crashAfter = crashAfter
    }

    /// Buys a product through every step. Throws `ServerUnavailable` when the server cannot be reached
    /// (the order stays `paid` and `resume()` finishes it later), a StoreKitError for App Store failures.
    @discardableResult
    public func buy(_ productIdentifier: String, quantity: Int = 1, simulate: String? = nil) async throws -> Order {
        var order = try await journal.create(productIdentifier: productIdentifier, quantity: quantity)
        try checkpoint(order)
        let transaction: PaymentTransaction
        do {
            transaction = try await appStore.add(Payment(productIdentifier: productIdentifier, quantity: quantity, simulate: simulate))
        } catch let error as StoreKitError {
            order.state = error.isCancellation ? .cancelled : .failed
            order.lastError = error.description
            try await journal.save(order)
            throw error
        }
        switch transaction.transactionState {
        case .purchased, .restored:
            order.state = .paid
            order.transactionIdentifier = transaction.transactionIdentifier
            order.signedTransaction = transaction.signedTransaction
        case .deferred:
            order.state = .deferred
            order.transactionIdentifier = transaction.transactionIdentifier
        case .failed, .purchasing:
            order.state = transaction.error?.isCancellation == true ? .cancelled : .failed
            order.lastError = transaction.error?.description
            try await journal.save(order)
            try? await appStore.finish(transaction.transactionIdentifier)  // failed transactions are finished too
            return order
        }
        try await journal.save(order)
        try checkpoint(order)
        return try await advance(order)
    }

    /// At launch: carries every open order on, and adopts App Store transactions the journal never saw
    /// (an approved Ask to Buy, a reinstalled app with an empty journal). Returns the orders it touched.
    @discardableResult
    public func resume() async throws -> [Order] {
        var touched: [Order] = []
        for transaction in try await appStore.unfinishedTransactions() where transaction.transactionState == .purchased {
            if var known = try await journal.order(transactionIdentifier: transaction.transactionIdentifier) {
                if known.state == .deferred {
                    known.state = .paid
                    known.signedTransaction = transaction.signedTransaction
                    try await journal.save(known)
                }
            } else {
                _ = try await journal.adopt(transaction)
            }
        }
        for order in try await journal.openOrders() {
            switch order.state {
            case .created:
                // Nothing was charged that the App Store still holds unfinished: the order never reached payment.
                var abandoned = order
                abandoned.state = .failed
                abandoned.lastError = "interrupted before the payment"
                try await journal.save(abandoned)
                touched.append(abandoned)
            case .deferred:
                continue
            default:
                touched.append(try await advance(order))
            }
        }
        return touched
    }

    /// The steps after payment, from wherever `order` stands.
    func advance(_ start: Order) async throws -> Order {
        var order = start
        while order.state.isOpen {
            switch order.state {
            case .paid:
                let verdict: ServerVerification
                if proof == .receipt, let receipt = try await appStore.appReceipt() {
                    verdict = try await server.upload(receipt: receipt, transactionId: order.transactionIdentifier, productId: order.productIdentifier)
                } else if let signed = order.signedTransaction {
                    verdict = try await server.upload(signedTransaction: signed)
                } else {
                    order.state = .failed
                    order.lastError = "nothing to prove the purchase with"
                    try await journal.save(order)
                    continue
                }
                order.verificationId = verdict.verificationId
                order.state = .uploaded
                try await journal.save(order)
                try checkpoint(order)
                try await settle(&order, verdict)
            case .uploaded:
                // The server has the proof; ask how its verification came out (it may still be talking to Apple).
                guard let id = order.verificationId else { order.state = .paid; continue }
                try await settle(&order, try await server.verification(id))
            case .verified:
                order = try await journal.deliver(order)
            case .delivered:
                if let id = order.transactionIdentifier { try await appStore.finish(id) }
                order.state = .finished
                try await journal.save(order)
            case .created, .deferred, .finished, .failed, .cancelled:
                return order
            }
            try checkpoint(order)
        }
        return order
    }

    /// What the user owns: the server's answer, kept in the journal; offline, the last answer kept (and says so).
    public func entitlements() async throws -> (entitlements: ServerEntitlements, offline: Bool, savedAt: Date?) {
        do {
            let fresh = try await server.entitlements()
            try? await journal.cache("entitlements", JSONEncoder().encode(fresh))
            return (fresh, false, nil)
        } catch let error as ServerUnavailable {
            guard let (body, savedAt) = try await journal.cached("entitlements"),
                  let cached = try? JSONDecoder().decode(ServerEntitlements.self, from: body) else { throw error }
            return (cached, true, savedAt)
        }
    }

    /// Applies the server's verdict to an uploaded order.
    private func settle(_ order: inout Order, _ verdict: ServerVerification) async throws {
        switch verdict.state {
        case "verified":
            order.state = .verified
        case "rejected", "dead":
            order.state = .failed
            order.lastError = verdict.reason ?? "rejected by the purchase server"
            if let id = order.transactionIdentifier { try? await appStore.finish(id) }
        default:
            throw ServerUnavailable(message: "verification \(verdict.verificationId) still \(verdict.state); the order resumes later")
        }
        try await journal.save(order)
    }

    /// Restores purchases on this device (a new device, a reinstall): restored transactions are uploaded
    /// with the refreshed receipt, so the server re-grants them to this user under its transfer policy.
    public func restore() async throws -> ServerVerification? {
        let restored = try await appStore.restore()
        for transaction in restored { try? await appStore.finish(transaction.transactionIdentifier) }
        guard !restored.isEmpty, let receipt = try await appStore.appReceipt(refresh: true) else { return nil }
        return try await server.upload(receipt: receipt)
    }

    private func checkpoint(_ order: Order) throws {
        if let crashAfter, order.state == crashAfter { throw InjectedCrash(after: crashAfter) }
    }
}

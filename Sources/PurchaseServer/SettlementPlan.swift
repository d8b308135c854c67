import AppStoreModels
import Foundation

/// A ledger row as the settlement rules see it.
public struct LedgerEntry: Sendable, Equatable {
    public var transactionId: String
    public var appId: String
    public var appUserId: String
    public var productId: String
    public var expiresDate: Int64?
    public var cancellationDate: Int64?
    public var creditedCurrency: String?
    public var creditedAmount: Int64?
    public var clawedBack: Bool
    /// A prorated refund's share (milliunits of the whole) as recorded; nil when refunded in full or not refunded.
    public var refundPercentage: Int? = nil
    /// When the information behind the row's cancellation and expiry was last true (ms): the newest
    /// current source seen (a JWS's `signedDate`, Apple's answer time for `latest_receipt_info`) or the
    /// date of a refund a receipt reported; 0 when only history was seen. Nothing older changes the row.
    public var stateDate: Int64

    public init(transactionId: String, appId: String, appUserId: String, productId: String, expiresDate: Int64? = nil,
                cancellationDate: Int64? = nil, creditedCurrency: String? = nil, creditedAmount: Int64? = nil, clawedBack: Bool = false,
                stateDate: Int64 = 0) {
        self.transactionId = transactionId
        self.appId = appId
        self.appUserId = appUserId
        self.productId = productId
        self.expiresDate = expiresDate
        self.cancellationDate = cancellationDate
        self.creditedCurrency = creditedCurrency
        self.creditedAmount = creditedAmount
        self.clawedBack = clawedBack
        self.stateDate = stateDate
    }
}

/// What one verification does to the ledger, decided without a database: verified transactions,
/// the ledger rows and owners they touch, the app's policies and the time in; actions and the
/// answer to the app out. `PurchaseStore.apply` reads the inputs and writes the actions in one
/// transaction. Every rule of the README's "Ledger rules" table is a case here.
public struct SettlementPlan: Sendable, Equatable {
    public enum Action: Sendable, Equatable {
        /// Insert the ledger row (for the settling user), its cancellation included when Apple reports one.
        case record(ConfirmedTransaction, mapping: ProductMapping, stateDate: Int64)
        /// Bind the original transaction to the settling user (creating the user).
        case bind(originalTransactionId: String, productId: String)
        /// Remove every owner of the original transaction (a transfer, before binding the new one).
        case unbindAll(originalTransactionId: String)
        /// Credit the settling user's balance for a new consumable, and remember it on the row.
        case credit(transactionId: String, currency: String, amount: Int64)
        /// A refund or revocation seen now.
        case cancel(transactionId: String, date: Int64, reason: String?, stateDate: Int64, percentage: Int? = nil)
        /// A refund already recorded, reported again by newer signed data with another share (full, or prorated).
        case updateRefundShare(transactionId: String, percentage: Int?, stateDate: Int64)
        /// A refund reversed: the row counts again.
        case reinstate(transactionId: String, stateDate: Int64)
        /// Take a refunded consumable's credit back from whoever received it (a negative balance flags the user).
        case clawBack(transactionId: String, user: String, currency: String, amount: Int64)
        /// Remember the credit of a consumable refunded before it was first seen, as taken back (nothing is credited).
        case withholdCredit(transactionId: String, currency: String, amount: Int64)
        /// Give a clawed-back credit back after the refund was reversed.
        case restoreCredit(transactionId: String, user: String, currency: String, amount: Int64)
        /// A renewal-date extension (or a correction): the transaction's expiry moves.
        case updateExpiry(transactionId: String, expiresDate: Int64?, stateDate: Int64)
        /// Newer information that changed nothing: remember when it was true.
        case observe(transactionId: String, stateDate: Int64)
        case audit(kind: String, user: String?, detail: [String: String])
    }

    public struct Input: Sendable {
        public var appId: String
        public var appUserId: String
        public var verificationId: String
        public var replayPolicy: ReplayPolicy
        public var mappings: [String: ProductMapping]
        public var transactions: [ConfirmedTransaction]
        /// Existing ledger rows of these transactions (this environment), by transaction id.
        public var ledger: [String: LedgerEntry]
        /// Current owners of the original transactions (this environment), by original transaction id.
        public var owners: [String: [String]]
        /// What the upload says it delivers, if it says.
        public var deliver: DeliveryHint?
        /// Now (ms), for the delivery window.
        public var now: Int64

        public init(appId: String, appUserId: String, verificationId: String, replayPolicy: ReplayPolicy, mappings: [String: ProductMapping],
                    transactions: [ConfirmedTransaction], ledger: [String: LedgerEntry], owners: [String: [String]], deliver: DeliveryHint? = nil,
                    now: Int64 = 0) {
            self.appId = appId
            self.appUserId = appUserId
            self.verificationId = verificationId
            self.replayPolicy = replayPolicy
            self.mappings = mappings
            self.transactions = transactions
            self.ledger = ledger
            self.owners = owners
            self.deliver = deliver
            self.now = now
        }
    }

    /// How long a new consumable an upload did not name waits for the upload that names it (ms);
    /// after that, whoever uploads a receipt holding it receives it.
    public static let deliveryWindow: Int64 = 5 * 60 * 1000

    public var actions: [Action] = []
    public var result = SettlementResult()

    /// The transactions to settle, once each: a transaction listed twice (in the receipt and in
    /// `latest_receipt_info`) is taken from its current source, in its first position.
    static func distinct(_ transactions: [ConfirmedTransaction]) -> [ConfirmedTransaction] {
        var order: [String] = []
        var chosen: [String: ConfirmedTransaction] = [:]
        for transaction in transactions {
            if let existing = chosen[transaction.transactionId] {
                if existing.observedAt == nil, transaction.observedAt != nil { chosen[transaction.transactionId] = transaction }
            } else {
                order.append(transaction.transactionId)
                chosen[transaction.transactionId] = transaction
            }
        }
        return order.compactMap { chosen[$0] }
    }

    /// Decides what the verification does.
    public static func make(_ input: Input) -> SettlementPlan {
        var plan = SettlementPlan()
        var owners = input.owners
        let transactions = distinct(input.transactions)
        if let deliver = input.deliver, let named = deliver.transactionId, !transactions.contains(where: { $0.transactionId == named }) {
            plan.result.refused.append(.init(transactionId: named, productId: deliver.productId ?? "", code: "transaction_not_in_receipt",
                                             reason: "transaction \(named), which this upload delivers, is not in the receipt"))
        }
        for transaction in transactions {
            guard let mapping = input.mappings[transaction.productId] else {
                if !plan.result.unknownProducts.contains(transaction.productId) { plan.result.unknownProducts.append(transaction.productId) }
                continue
            }
            plan.settle(transaction, mapping: mapping, existing: input.ledger[transaction.transactionId], owners: &owners, input)
        }
        return plan
    }

    private mutating func refuse(_ transaction: ConfirmedTransaction, _ code: String, _ reason: String) {
        result.refused.append(.init(transactionId: transaction.transactionId, productId: transaction.productId, code: code, reason: reason))
    }

    private mutating func settle(_ transaction: ConfirmedTransaction, mapping: ProductMapping, existing: LedgerEntry?,
                                 owners: inout [String: [String]], _ input: Input) {
        let user = input.appUserId
        let original = transaction.originalTransactionId
        // Apple sells 1…10 units per transaction; anything else is refused before it can multiply a credit.
        guard ProductMapping.acceptedQuantities.contains(transaction.quantity) else {
            refuse(transaction, "invalid_quantity", "transaction \(transaction.transactionId) has quantity \(transaction.quantity)")
            return
        }
        if let existing, existing.appId != input.appId {
            refuse(transaction, "other_app", "transaction \(transaction.transactionId) belongs to another app")
            return
        }
        let inserted = existing == nil
        // A new consumable this upload does not name belongs to whoever names it; unnamed, it waits out the window.
        if inserted, mapping.type == .consumable, let deliver = input.deliver, !deliver.names(transaction),
           input.now - transaction.purchaseDate.milliseconds < Self.deliveryWindow {
            result.deferred.append(transaction.transactionId)
            return
        }
        if inserted {
            // History (a receipt's purchase list) observes nothing current: only a refund it reports dates the row.
            let stateDate = Self.observed(transaction, now: input.now) ?? transaction.cancellationDate?.milliseconds ?? 0
            actions.append(.record(transaction, mapping: mapping, stateDate: stateDate))
        }

        // Ownership, bound to the original transaction under the app's replay policy (consumables never move).
        let current = owners[original] ?? []
        var owns = current.contains(user)
        if current.isEmpty {
            actions.append(.bind(originalTransactionId: original, productId: transaction.productId))
            owners[original] = [user]
            owns = true
        } else if !owns {
            let detail = ["originalTransactionId": original, "verificationId": input.verificationId]
            switch mapping.type == .consumable ? ReplayPolicy.reject : input.replayPolicy {
            case .reject:
                refuse(transaction, "replay_refused", "transaction \(original) is bound to another user")
                actions.append(.audit(kind: "replay_refused", user: user, detail: detail.merging(["owner": current.joined(separator: ",")]) { $1 }))
                // A refund is a fact whoever's receipt reports it: it only ever takes away.
                if let existing, transaction.cancellationDate != nil { update(existing, with: transaction, input, cancelOnly: true) }
                return
            case .transfer:
                actions.append(.unbindAll(originalTransactionId: original))
                actions.append(.bind(originalTransactionId: original, productId: transaction.productId))
                actions.append(.audit(kind: "ownership_transferred", user: user, detail: detail.merging(["from": current.joined(separator: ",")]) { $1 }))
                owners[original] = [user]
                owns = true
            case .share:
                actions.append(.bind(originalTransactionId: original, productId: transaction.productId))
                actions.append(.audit(kind: "ownership_shared", user: user, detail: detail.merging(["with": current.joined(separator: ",")]) { $1 }))
                owners[original] = current + [user]
                owns = true
            }
        }
        if inserted { result.granted.append(transaction.transactionId) } else { result.alreadyOwned.append(transaction.transactionId) }

        // Consumables credit their balance once, when first recorded. One already refunded when first seen
        // credits nothing, but its credit is remembered as taken back, so a reversal later gives it.
        if inserted, owns, mapping.type == .consumable, let currency = mapping.currency, let amount = mapping.amount {
            let credit = ProductMapping.credit(amount, times: transaction.quantity)
            actions.append(transaction.cancellationDate == nil ? .credit(transactionId: transaction.transactionId, currency: currency, amount: credit)
                                                               : .withholdCredit(transactionId: transaction.transactionId, currency: currency, amount: credit))
        }
        if let existing { update(existing, with: transaction, input) }
    }

    /// When a current source was true, never later than now: a signature dated in the future (clock skew,
    /// a leaked key) cannot date a row ahead and so freeze it against the refunds that follow.
    static func observed(_ transaction: ConfirmedTransaction, now: Int64) -> Int64? {
        transaction.observedAt.map { min($0.milliseconds, now) }
    }

    /// A transaction seen before: newer information cancels, reinstates or moves the expiry; older
    /// information changes nothing. A receipt's own purchase list is history (an old receipt
    /// uploaded again must not undo a refund), so it can only add a refund Apple reports, never remove one.
    private mutating func update(_ existing: LedgerEntry, with transaction: ConfirmedTransaction, _ input: Input, cancelOnly: Bool = false) {
        let id = transaction.transactionId
        let cancelled = transaction.cancellationDate?.milliseconds
        let stateDate: Int64
        if let observed = Self.observed(transaction, now: input.now) {
            // Newer news only; but a refund signed at the very instant of the row's last news is news too (Apple signs a
            // refund request's DID_CHANGE_RENEWAL_STATUS and the REFUND that grants it in the same millisecond when
            // they happen together): a refund only takes away, and nothing undoes it at an equal time.
            let sameInstantRefund = observed == existing.stateDate && cancelled != nil && existing.cancellationDate == nil
            guard observed > existing.stateDate || sameInstantRefund else { return }
            stateDate = observed
        } else {
            guard let cancelled, existing.cancellationDate == nil, cancelled > existing.stateDate else { return }
            stateDate = cancelled
        }
        var changed = false
        if let cancelled, existing.cancellationDate == nil {
            changed = true
            actions.append(.cancel(transactionId: id, date: cancelled, reason: transaction.cancellationReason, stateDate: stateDate,
                                   percentage: transaction.refundPercentage))
            result.revoked.append(id)
            actions.append(.audit(kind: "transaction_revoked", user: existing.appUserId, detail: ["transactionId": id, "verificationId": input.verificationId]))
            if let currency = existing.creditedCurrency, let amount = existing.creditedAmount, !existing.clawedBack {
                actions.append(.clawBack(transactionId: id, user: existing.appUserId, currency: currency, amount: amount))
            }
        } else if cancelled != nil, existing.cancellationDate != nil, transaction.isSigned, transaction.refundPercentage != existing.refundPercentage {
            // Only Apple's signature knows the share: newer signed data corrects what a receipt (no share) or an older JWS said.
            changed = true
            actions.append(.updateRefundShare(transactionId: id, percentage: transaction.refundPercentage, stateDate: stateDate))
        } else if !cancelOnly, cancelled == nil, existing.cancellationDate != nil, transaction.isSigned {
            // Only Apple's signature says a refund was reversed: a verifyReceipt answer that merely lacks
            // the refund (an answer that lags) never gives credit back.
            changed = true
            actions.append(.reinstate(transactionId: id, stateDate: stateDate))
            result.reinstated.append(id)
            actions.append(.audit(kind: "transaction_reinstated", user: existing.appUserId, detail: ["transactionId": id, "verificationId": input.verificationId]))
            if let currency = existing.creditedCurrency, let amount = existing.creditedAmount, existing.clawedBack {
                actions.append(.restoreCredit(transactionId: id, user: existing.appUserId, currency: currency, amount: amount))
            }
        }
        // A signed transaction moves the expiry either way; verifyReceipt's latest_receipt_info only extends it.
        if !cancelOnly, transaction.observedAt != nil, let expires = transaction.expiresDate?.milliseconds, expires != existing.expiresDate,
           transaction.isSigned || expires > (existing.expiresDate ?? .min) {
            changed = true
            actions.append(.updateExpiry(transactionId: id, expiresDate: expires, stateDate: stateDate))
            actions.append(.audit(kind: "expiry_changed", user: existing.appUserId,
                                  detail: ["transactionId": id, "from": existing.expiresDate.map(String.init) ?? "", "to": String(expires)]))
        }
        // Only Apple's signature dates a row that did not change: an unsigned answer that was not allowed to
        // change it (a missing refund, an earlier expiry) must not shadow the signed reversal or extension behind it.
        if !changed, transaction.isSigned { actions.append(.observe(transactionId: id, stateDate: stateDate)) }
    }
}

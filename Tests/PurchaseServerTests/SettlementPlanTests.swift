import AppStoreModels
import Foundation
@testable import PurchaseServer
import Testing

/// The ledger's rules as a table: each row is one rule of the README's "Ledger rules", checked on
/// `SettlementPlan` alone (no database).
@Suite("Settlement plan: the ledger's rules as values")
struct SettlementPlanTests {
    static let coins = ProductMapping(productId: "coins100", type: .consumable, currency: "coins", amount: 100)
    static let pro = ProductMapping(productId: "pro", type: .nonConsumable, entitlement: "pro")
    static let monthly = ProductMapping(productId: "monthly", type: .autoRenewable, entitlement: "pro")
    static let mappings = [coins.productId: coins, pro.productId: pro, monthly.productId: monthly]

    static func ms(_ value: Int64) -> Date { Date(milliseconds: value) }

    /// A transaction as a receipt's own list has it (history) or as a JWS signed at `signed` (current).
    static func tx(_ id: String, _ product: String, original: String? = nil, quantity: Int64 = 1, expires: Int64? = nil,
                   cancelled: Int64? = nil, signed: Int64? = nil, answered: Int64? = nil) -> ConfirmedTransaction {
        ConfirmedTransaction(transactionId: id, originalTransactionId: original, productId: product, quantity: quantity, purchaseDate: ms(1_000),
                             expiresDate: expires.map(ms), cancellationDate: cancelled.map(ms),
                             source: signed != nil ? "signed_transaction" : answered != nil ? "latest_receipt_info" : "receipt",
                             observedAt: (signed ?? answered).map(ms))
    }

    /// The plans' clock: later than every date in the tables.
    static let now: Int64 = 1_000_000

    static func row(_ id: String, _ product: String, user: String = "alice", app: String = "app", expires: Int64? = nil, cancelled: Int64? = nil,
                    credited: Int64? = nil, clawedBack: Bool = false, stateDate: Int64 = 0) -> LedgerEntry {
        LedgerEntry(transactionId: id, appId: app, appUserId: user, productId: product, expiresDate: expires, cancellationDate: cancelled,
                    creditedCurrency: credited == nil ? nil : "coins", creditedAmount: credited, clawedBack: clawedBack, stateDate: stateDate)
    }

    static func plan(_ transactions: [ConfirmedTransaction], ledger: [LedgerEntry] = [], owners: [String: [String]] = [:],
                     user: String = "alice", policy: ReplayPolicy = .reject) -> SettlementPlan {
        SettlementPlan.make(.init(appId: "app", appUserId: user, verificationId: "job", replayPolicy: policy, mappings: mappings,
                                  transactions: transactions, ledger: Dictionary(uniqueKeysWithValues: ledger.map { ($0.transactionId, $0) }), owners: owners,
                                  now: now))
    }

    /// The actions without audit events (those are checked where they matter).
    static func effects(_ plan: SettlementPlan) -> [SettlementPlan.Action] {
        plan.actions.filter { if case .audit = $0 { return false } else { return true } }
    }

    @Test("A new consumable is recorded, bound and credited once per unit")
    func newConsumable() {
        let transaction = Self.tx("1", "coins100", quantity: 3)
        let plan = Self.plan([transaction])
        #expect(Self.effects(plan) == [.record(transaction, mapping: Self.coins, stateDate: 0), .bind(originalTransactionId: "1", productId: "coins100"),
                                       .credit(transactionId: "1", currency: "coins", amount: 300)])
        #expect(plan.result.granted == ["1"])
    }

    @Test("A consumable already refunded when first seen is recorded with its refund and credits nothing (its credit is kept as taken back)")
    func refundedOnArrival() {
        let transaction = Self.tx("1", "coins100", cancelled: 5_000)
        #expect(Self.effects(Self.plan([transaction])) == [.record(transaction, mapping: Self.coins, stateDate: 5_000),
                                                           .bind(originalTransactionId: "1", productId: "coins100"),
                                                           .withholdCredit(transactionId: "1", currency: "coins", amount: 100)])
    }

    @Test("Quantities outside 1…100 and other apps' transactions are refused, nothing recorded", arguments: [0, -1, 101] as [Int64])
    func refusals(quantity: Int64) {
        let plan = Self.plan([Self.tx("1", "coins100", quantity: quantity)])
        #expect(plan.actions.isEmpty && plan.result.refused.map(\.code) == ["invalid_quantity"])
        let other = Self.plan([Self.tx("2", "pro")], ledger: [Self.row("2", "pro", app: "other")])
        #expect(other.actions.isEmpty && other.result.refused.map(\.code) == ["other_app"])
    }

    @Test("Unknown products are listed, not recorded")
    func unknownProducts() {
        let plan = Self.plan([Self.tx("1", "mystery"), Self.tx("2", "mystery")])
        #expect(plan.actions.isEmpty && plan.result.unknownProducts == ["mystery"])
    }

    @Test("Replay policy: reject keeps the first owner, transfer moves it, share adds; consumables never move",
          arguments: [(ReplayPolicy.reject, "pro"), (.transfer, "pro"), (.share, "pro"), (.transfer, "coins100")])
    func replay(policy: ReplayPolicy, product: String) {
        let plan = Self.plan([Self.tx("1", product)], ledger: [Self.row("1", product, user: "bob")], owners: ["1": ["bob"]], user: "alice", policy: policy)
        let effects = Self.effects(plan)
        switch (policy, product) {
        case (.transfer, "pro"):
            #expect(effects == [.unbindAll(originalTransactionId: "1"), .bind(originalTransactionId: "1", productId: "pro")])
        case (.share, _):
            #expect(effects == [.bind(originalTransactionId: "1", productId: "pro")])
        default:
            #expect(effects.isEmpty && plan.result.refused.map(\.code) == ["replay_refused"])
        }
    }

    @Test("Renewals of one subscription in one receipt bind once")
    func renewalsBindOnce() {
        let plan = Self.plan([Self.tx("1", "monthly", expires: 2_000), Self.tx("2", "monthly", original: "1", expires: 3_000)])
        #expect(Self.effects(plan).filter { if case .bind = $0 { return true } else { return false } }.count == 1)
        #expect(plan.result.granted == ["1", "2"])
    }

    @Test("The same transaction in the receipt and in latest_receipt_info is taken once, from the current source")
    func currentSourceWins() {
        let history = Self.tx("1", "monthly", expires: 2_000)
        let current = Self.tx("1", "monthly", expires: 9_000, signed: 8_000)
        let plan = Self.plan([history, current])
        #expect(Self.effects(plan).first == .record(current, mapping: Self.monthly, stateDate: 8_000))
    }

    // A seen transaction. Columns: what the ledger holds, what arrives, what the plan does.
    struct Case: Sendable, CustomTestStringConvertible {
        let rule: String
        let row: LedgerEntry
        let incoming: ConfirmedTransaction
        let expected: [SettlementPlan.Action]
        var testDescription: String { rule }
    }

    static let seen: [Case] = [
        Case(rule: "a refund reported by a receipt revokes and claws the credit back",
             row: row("1", "coins100", credited: 100), incoming: tx("1", "coins100", cancelled: 5_000),
             expected: [.cancel(transactionId: "1", date: 5_000, reason: nil, stateDate: 5_000),
                        .clawBack(transactionId: "1", user: "alice", currency: "coins", amount: 100)]),
        Case(rule: "a refund signed by Apple revokes, dated by its signature",
             row: row("1", "pro"), incoming: tx("1", "pro", cancelled: 5_000, signed: 6_000),
             expected: [.cancel(transactionId: "1", date: 5_000, reason: nil, stateDate: 6_000)]),
        Case(rule: "a credit already clawed back is not clawed back twice",
             row: row("1", "coins100", credited: 100, clawedBack: true), incoming: tx("1", "coins100", cancelled: 5_000),
             expected: [.cancel(transactionId: "1", date: 5_000, reason: nil, stateDate: 5_000)]),
        Case(rule: "a reversal signed after the refund reinstates and restores the credit",
             row: row("1", "coins100", cancelled: 5_000, credited: 100, clawedBack: true, stateDate: 5_000), incoming: tx("1", "coins100", signed: 7_000),
             expected: [.reinstate(transactionId: "1", stateDate: 7_000), .restoreCredit(transactionId: "1", user: "alice", currency: "coins", amount: 100)]),
        Case(rule: "a verifyReceipt answer that lacks the refund (one that lags) does not undo it",
             row: row("1", "coins100", cancelled: 5_000, credited: 100, clawedBack: true, stateDate: 5_000), incoming: tx("1", "coins100", answered: 7_000),
             expected: []),
        Case(rule: "a verifyReceipt answer extends an expiry",
             row: row("1", "monthly", expires: 10_000, stateDate: 2_000), incoming: tx("1", "monthly", expires: 40_000, answered: 3_000),
             expected: [.updateExpiry(transactionId: "1", expiresDate: 40_000, stateDate: 3_000)]),
        Case(rule: "a verifyReceipt answer with an older expiry (one that lags) does not shrink it",
             row: row("1", "monthly", expires: 40_000, stateDate: 2_000), incoming: tx("1", "monthly", expires: 10_000, answered: 3_000),
             expected: []),
        Case(rule: "a signature dated in the future dates the row no later than now",
             row: row("1", "pro"), incoming: tx("1", "pro", cancelled: 5_000, signed: 9_000_000_000),
             expected: [.cancel(transactionId: "1", date: 5_000, reason: nil, stateDate: now)]),
        Case(rule: "a transaction signed before the refund does not undo it",
             row: row("1", "coins100", cancelled: 5_000, credited: 100, clawedBack: true, stateDate: 5_000), incoming: tx("1", "coins100", signed: 4_000),
             expected: []),
        Case(rule: "a receipt's own list (history) never undoes a refund",
             row: row("1", "pro", cancelled: 5_000, stateDate: 5_000), incoming: tx("1", "pro"),
             expected: []),
        Case(rule: "a refund older than a reversal already applied changes nothing",
             row: row("1", "pro", stateDate: 7_000), incoming: tx("1", "pro", cancelled: 5_000, signed: 6_000),
             expected: []),
        Case(rule: "a refund reported by history, older than what a signed source said since, changes nothing",
             row: row("1", "pro", stateDate: 7_000), incoming: tx("1", "pro", cancelled: 5_000),
             expected: []),
        Case(rule: "an extension signed later moves the expiry",
             row: row("1", "monthly", expires: 10_000, stateDate: 2_000), incoming: tx("1", "monthly", expires: 40_000, signed: 3_000),
             expected: [.updateExpiry(transactionId: "1", expiresDate: 40_000, stateDate: 3_000)]),
        Case(rule: "an older expiry from history does not shrink an extension",
             row: row("1", "monthly", expires: 40_000, stateDate: 3_000), incoming: tx("1", "monthly", expires: 10_000),
             expected: []),
        Case(rule: "an older signed transaction does not shrink an extension",
             row: row("1", "monthly", expires: 40_000, stateDate: 3_000), incoming: tx("1", "monthly", expires: 10_000, signed: 2_000),
             expected: []),
        Case(rule: "newer information that changes nothing is remembered",
             row: row("1", "monthly", expires: 10_000, stateDate: 2_000), incoming: tx("1", "monthly", expires: 10_000, signed: 3_000),
             expected: [.observe(transactionId: "1", stateDate: 3_000)]),
        Case(rule: "a refund signed at the same instant as the row's last news revokes (a refund request and its grant together)",
             row: row("1", "pro", stateDate: 6_000), incoming: tx("1", "pro", cancelled: 5_000, signed: 6_000),
             expected: [.cancel(transactionId: "1", date: 5_000, reason: nil, stateDate: 6_000)]),
        Case(rule: "a reversal signed at the same instant as the refund changes nothing",
             row: row("1", "pro", cancelled: 5_000, stateDate: 6_000), incoming: tx("1", "pro", signed: 6_000),
             expected: []),
        Case(rule: "the same signed transaction again changes nothing",
             row: row("1", "monthly", expires: 10_000, stateDate: 3_000), incoming: tx("1", "monthly", expires: 10_000, signed: 3_000),
             expected: []),
    ]

    @Test("A transaction seen before", arguments: seen)
    func seenBefore(_ rule: Case) {
        let plan = Self.plan([rule.incoming], ledger: [rule.row], owners: ["1": [rule.row.appUserId]])
        #expect(Self.effects(plan) == rule.expected)
        #expect(plan.result.alreadyOwned == ["1"] && plan.result.granted.isEmpty)
    }

    @Test("Revocations and reinstatements are audited for the user who owns the row")
    func audited() {
        let plan = Self.plan([Self.tx("1", "pro", cancelled: 5_000)], ledger: [Self.row("1", "pro", user: "bob")], owners: ["1": ["bob", "alice"]])
        #expect(plan.actions.contains(.audit(kind: "transaction_revoked", user: "bob", detail: ["transactionId": "1", "verificationId": "job"])))
        #expect(plan.result.revoked == ["1"])
    }

    static func hinted(_ transactions: [ConfirmedTransaction], _ hint: DeliveryHint?, now: Int64) -> SettlementPlan {
        SettlementPlan.make(.init(appId: "app", appUserId: "bob", verificationId: "job", replayPolicy: .reject, mappings: mappings,
                                  transactions: transactions, ledger: [:], owners: [:], deliver: hint, now: now))
    }

    @Test("An upload that names its consumable takes only that one while the others are fresh; unnamed, the uploader takes all")
    func namedDelivery() {
        let alices = ConfirmedTransaction(transactionId: "1", productId: "coins100", purchaseDate: Self.ms(1_000), source: "receipt")
        let bobs = ConfirmedTransaction(transactionId: "2", productId: "coins100", purchaseDate: Self.ms(2_000), source: "receipt")
        let fresh = Self.hinted([alices, bobs], DeliveryHint(transactionId: "2", productId: "coins100"), now: 3_000)
        #expect(fresh.result.granted == ["2"] && fresh.result.deferred == ["1"])
        #expect(!fresh.actions.contains { if case .record(let t, _, _) = $0 { return t.transactionId == "1" } else { return false } })
        let late = Self.hinted([alices, bobs], DeliveryHint(transactionId: "2", productId: nil), now: 1_000 + SettlementPlan.deliveryWindow)
        #expect(late.result.granted == ["1", "2"] && late.result.deferred.isEmpty)
        let unnamed = Self.hinted([alices, bobs], nil, now: 3_000)
        #expect(unnamed.result.granted == ["1", "2"])
        let byProduct = Self.hinted([alices, bobs], DeliveryHint(transactionId: nil, productId: "coins100"), now: 3_000)
        #expect(byProduct.result.granted == ["1", "2"])
        let missing = Self.hinted([alices], DeliveryHint(transactionId: "9", productId: "coins100"), now: 3_000)
        #expect(missing.result.refused.map(\.code) == ["transaction_not_in_receipt"] && missing.result.deferred == ["1"])
    }

    @Test("A refund in another user's upload is applied all the same; nothing else of theirs is")
    func refundFromAnotherUpload() {
        let plan = Self.plan([Self.tx("1", "coins100", cancelled: 5_000)], ledger: [Self.row("1", "coins100", user: "bob", credited: 100)],
                             owners: ["1": ["bob"]], user: "alice")
        #expect(plan.result.refused.map(\.code) == ["replay_refused"] && plan.result.revoked == ["1"])
        #expect(Self.effects(plan) == [.cancel(transactionId: "1", date: 5_000, reason: nil, stateDate: 5_000),
                                       .clawBack(transactionId: "1", user: "bob", currency: "coins", amount: 100)])
        let reversal = Self.plan([Self.tx("1", "coins100", signed: 9_000)],
                                 ledger: [Self.row("1", "coins100", user: "bob", cancelled: 5_000, credited: 100, clawedBack: true, stateDate: 5_000)],
                                 owners: ["1": ["bob"]], user: "alice")
        #expect(Self.effects(reversal).isEmpty)
    }
}

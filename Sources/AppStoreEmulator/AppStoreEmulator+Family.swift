import AppStoreModels
import Foundation

/// Family Sharing: purchases of family-shareable products reach every other member of the
/// purchaser's family as FAMILY_SHARED transactions of their own; leaving the family, or a refund
/// of the purchase, revokes them (REVOKE).
extension AppStoreEmulator {
    /// Puts an account in a family (nil: takes it out). Joining shares the family's purchases with
    /// the newcomer and the newcomer's with the family; leaving revokes both.
    public func setFamily(email: String, family: String?) async throws -> Account {
        try await mutate { state, changes, now in
            guard var account = state.accounts[email.lowercased()] else { throw StoreError.notFound("Account \(email)") }
            if account.family != nil { Self.leaveFamily(&state, &changes, account: account, now: now) }
            account.family = family
            state.accounts[email.lowercased()] = account
            changes.accounts.insert(email.lowercased())
            if family != nil {
                let members = state.accounts.values.filter { $0.family == family && $0.environment == account.environment }
                let shareable = state.transactions.values.filter { record in
                    members.contains { $0.email.lowercased() == record.accountEmail.lowercased() } && record.sharedFromTransactionId == nil
                }.sorted { ($0.purchaseDate, $0.id) < ($1.purchaseDate, $1.id) }
                for record in shareable where Self.isSharedNow(record, state: state, now: now) {
                    Self.shareWithFamily(&state, &changes, record, now: now)
                }
            }
            return account
        }
    }

    /// Whether `record` is a live purchase a family would share now.
    static func isSharedNow(_ record: TransactionRecord, state: EmulatorState, now: Date) -> Bool {
        guard record.state == .purchased, !record.isRedelivery, record.cancellationDate == nil,
              state.product(record.bundleId, record.productId)?.familyShareable == true else { return false }
        switch record.productType {
        case .nonConsumable, .freeSubscription: return true
        case .autoRenewable: return state.chains[record.originalId]?.latestTransactionId == record.id && (record.expiresDate ?? .distantPast) > now
        case .consumable, .nonRenewing: return false
        }
    }

    /// Gives every other family member (same environment) their own FAMILY_SHARED copy of `record`.
    static func shareWithFamily(_ state: inout EmulatorState, _ changes: inout Changes, _ record: TransactionRecord, now: Date) {
        guard isSharedNow(record, state: state, now: now),
              let family = state.accounts[record.accountEmail.lowercased()]?.family else { return }
        let members = state.accounts.values.filter {
            $0.family == family && $0.email.lowercased() != record.accountEmail.lowercased() && $0.environment == record.environment && !$0.deleted
        }
        for member in members.sorted(by: { $0.email < $1.email }) {
            let existing = state.transactions(account: member.email, bundle: record.bundleId, environment: record.environment)
            if existing.contains(where: { $0.sharedFromTransactionId == record.id }) { continue }
            var copy = record
            copy.id = state.nextTransactionId(record.environment)
            copy.accountEmail = member.email
            copy.deviceId = ""
            copy.finished = false
            copy.applicationUsername = nil
            copy.appAccountToken = nil
            copy.sharedFromTransactionId = record.id
            if record.productType == .autoRenewable, let chain = state.chains[record.originalId] {
                // The member's subscription has its own original id and renews with the purchaser's.
                let memberChain = state.chains.values.first { $0.sharedFromOriginalId == chain.originalTransactionId && $0.accountEmail.lowercased() == member.email.lowercased() }
                copy.originalId = memberChain?.originalTransactionId ?? copy.id
                copy.webOrderLineItemId = state.nextWebOrderLineItemId(record.environment)
                var shared = memberChain ?? SubscriptionChain(
                    originalTransactionId: copy.id, bundleId: chain.bundleId, accountEmail: member.email, deviceId: "", environment: chain.environment,
                    productId: chain.productId, subscriptionGroupId: chain.subscriptionGroupId, autoRenewProductId: chain.autoRenewProductId,
                    autoRenewEnabled: true, renewals: 0, introPeriodsRemaining: 0, expirationIntent: nil, latestTransactionId: copy.id)
                shared.sharedFromOriginalId = chain.originalTransactionId
                shared.latestTransactionId = copy.id
                shared.productId = copy.productId
                shared.autoRenewEnabled = true
                shared.expiryNotified = nil
                state.chains[shared.originalTransactionId] = shared
                changes.chains.insert(shared.originalTransactionId)
            } else {
                copy.originalId = copy.id
            }
            state.insert(copy)
            changes.transactions.insert(copy.id)
            changes.notify(copy.productType == .autoRenewable ? .subscribed : .oneTimeCharge,
                           copy.productType == .autoRenewable ? .initialBuy : nil, copy)
        }
    }

    /// Revokes the family copies of `record` (REVOKE), e.g. after a refund.
    static func revokeFamilyCopies(_ state: inout EmulatorState, _ changes: inout Changes, of record: TransactionRecord, now: Date) {
        for (id, copy) in state.transactions where copy.sharedFromTransactionId == record.id && copy.cancellationDate == nil {
            revoke(&state, &changes, id: id, copy: copy, now: now)
        }
    }

    /// Takes `account`'s shared copies away and its purchases from the rest of the family.
    static func leaveFamily(_ state: inout EmulatorState, _ changes: inout Changes, account: Account, now: Date) {
        let email = account.email.lowercased()
        for (id, copy) in state.transactions where copy.sharedFromTransactionId != nil && copy.cancellationDate == nil {
            let received = copy.accountEmail.lowercased() == email
            let given = state.transactions[copy.sharedFromTransactionId!]?.accountEmail.lowercased() == email
            if received || given { revoke(&state, &changes, id: id, copy: copy, now: now) }
        }
    }

    private static func revoke(_ state: inout EmulatorState, _ changes: inout Changes, id: String, copy: TransactionRecord, now: Date) {
        var revoked = copy
        revoked.cancellationDate = now
        revoked.cancellationReason = 0
        state.update(revoked)
        changes.transactions.insert(id)
        if var chain = state.chains[copy.originalId], chain.sharedFromOriginalId != nil {
            chain.autoRenewEnabled = false
            chain.expiryNotified = true  // revoked, not expired
            state.chains[chain.originalTransactionId] = chain
            changes.chains.insert(chain.originalTransactionId)
        }
        changes.notify(.revoke, nil, revoked)
    }
}

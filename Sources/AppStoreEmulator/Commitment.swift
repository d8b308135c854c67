import AppStoreModels
import Foundation

/// Where a transaction paid on a monthly billing plan stands in its 12-month commitment: which installment it
/// is, when the commitment ends and what the whole commitment costs. A value, like the chain it belongs to.
public struct Commitment: Codable, Sendable, Equatable {
    /// This installment, 1…`totalBillingPeriods`.
    public var billingPeriodNumber: Int
    public var totalBillingPeriods: Int
    /// When the commitment ends: the end of its last installment.
    public var expiresDate: Date
    /// The whole commitment's price, as the plan named it.
    public var priceAmount: String?
    /// When the commitment began: installment n ends n months after it (months added to the previous end would drift).
    public var startDate: Date?

    /// The first installment of a commitment that starts at `start`.
    static func starting(at start: Date, plan: BillingPlan, rate: RenewalRate) -> Commitment {
        Commitment(billingPeriodNumber: 1, totalBillingPeriods: BillingPlan.commitmentMonths,
                   expiresDate: AppStoreEmulator.periodEnd(from: start, period: .oneMonth, rate: rate, count: BillingPlan.commitmentMonths),
                   priceAmount: plan.commitmentAmount, startDate: start)
    }

    /// When this installment ends.
    func installmentEnd(after previousEnd: Date, rate: RenewalRate) -> Date {
        guard let startDate else { return AppStoreEmulator.periodEnd(from: previousEnd, period: .oneMonth, rate: rate) }
        return AppStoreEmulator.periodEnd(from: startDate, period: .oneMonth, rate: rate, count: billingPeriodNumber)
    }

    /// Whether installments remain after this one.
    var continues: Bool { billingPeriodNumber < totalBillingPeriods }

    /// The next installment of the same commitment.
    var next: Commitment {
        var next = self
        next.billingPeriodNumber += 1
        return next
    }

    /// As a signed transaction's `commitmentInfo`.
    var transactionInfo: TransactionCommitmentInfo {
        TransactionCommitmentInfo(billingPeriodNumber: billingPeriodNumber, commitmentExpiresDate: ReceiptDate.milliseconds(expiresDate),
                                  commitmentPrice: priceAmount.flatMap(Milliunits.from), totalBillingPeriods: totalBillingPeriods)
    }
}

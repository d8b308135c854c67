import AppStoreModels
import Foundation
import Storage

/// Revenue from the ledger for the company's books (seed 003): counts, gross, refunds and net per group.
public struct RevenueReport: Codable, Sendable, Equatable {
    public struct Row: Codable, Sendable, Equatable {
        public var day: String?
        public var productId: String?
        public var currency: String?
        public var environment: String?
        public var transactions: Int64
        public var units: Int64
        public var gross: String
        public var refunds: Int64
        public var refunded: String
        public var net: String
    }

    /// Which dimensions to group by.
    public enum Dimension: String, Codable, Sendable, CaseIterable {
        case day, product, currency, environment
    }

    public var from: Int64
    public var to: Int64
    public var group: [Dimension]
    public var rows: [Row]
    public var totals: [String: String]
}

extension PurchaseStore {
    /// Revenue between `from` (inclusive) and `to` (exclusive) by purchase date, in exact decimals.
    public func revenue(appId: String?, from: Date, to: Date, group: [RevenueReport.Dimension]) async throws -> RevenueReport {
        let sales = try await database.longRead { db in
            try LedgerReader(db: db).sales(appId: appId, from: from.milliseconds, to: to.milliseconds, byDay: group.contains(.day),
                                           byProduct: group.contains(.product), byEnvironment: group.contains(.environment))
        }
        return RevenueReport(from: from.milliseconds, to: to.milliseconds, group: group, sales: sales)
    }
}

extension RevenueReport {
    /// The report of these sales, grouped by `group`: counts, units and exact decimal sums per group,
    /// and net totals per currency (refunded sales count in gross and refunds, not in net).
    init(from: Int64, to: Int64, group: [Dimension], sales: [LedgerSales]) {
        struct Accumulator {
            var transactions: Int64 = 0, units: Int64 = 0, refunds: Int64 = 0
            var gross = Decimal(0), refunded = Decimal(0)
        }
        var groups: [[String?]: Accumulator] = [:]
        var totals: [String: Decimal] = [:]
        for sale in sales {
            let currency = sale.currency ?? "unpriced"
            let key: [String?] = group.map { dimension in
                switch dimension {
                case .day: return sale.day.map { ReceiptDay.string(Date(milliseconds: $0 &* 86_400_000)) }
                case .product: return sale.productId
                case .currency: return currency
                case .environment: return sale.environment
                }
            }
            // Exact: the unit price times the units sold at it, as each sale's price times its quantity summed.
            let amount = (Decimal(string: sale.price ?? "0") ?? 0) * Decimal(sale.units)
            var accumulator = groups[key] ?? Accumulator()
            accumulator.transactions &+= sale.transactions
            accumulator.units &+= sale.units
            accumulator.gross += amount
            totals[currency, default: 0] += amount
            if sale.refunded {
                accumulator.refunds &+= sale.transactions
                // A prorated refund gives back its share of the price; any other refund all of it.
                let share = sale.refundPercentage.map { Decimal(min(max($0, 0), 100_000)) / 100_000 } ?? 1
                accumulator.refunded += amount * share
                totals[currency, default: 0] -= amount * share
            }
            groups[key] = accumulator
        }
        let formatter = NumberFormatter()
        formatter.minimumFractionDigits = 2
        formatter.maximumFractionDigits = 2
        formatter.minimumIntegerDigits = 1
        formatter.usesGroupingSeparator = false
        formatter.locale = Locale(identifier: "en_US_POSIX")
        func text(_ value: Decimal) -> String {
            var rounded = Decimal()
            var copy = value
            NSDecimalRound(&rounded, &copy, 2, .plain)
            return formatter.string(from: rounded as NSDecimalNumber) ?? "\(rounded)"
        }
        let reportRows = groups.map { key, value -> RevenueReport.Row in
            func part(_ dimension: RevenueReport.Dimension) -> String? { group.firstIndex(of: dimension).flatMap { key[$0] } }
            return RevenueReport.Row(day: part(.day), productId: part(.product), currency: part(.currency), environment: part(.environment),
                                     transactions: value.transactions, units: value.units, gross: text(value.gross), refunds: value.refunds,
                                     refunded: text(value.refunded), net: text(value.gross - value.refunded))
        }.sorted { lhs, rhs in
            [lhs.day, lhs.productId, lhs.currency, lhs.environment].map { $0 ?? "" }.lexicographicallyPrecedes([rhs.day, rhs.productId, rhs.currency, rhs.environment].map { $0 ?? "" })
        }
        self.init(from: from, to: to, group: group, rows: reportRows, totals: totals.mapValues(text))
    }
}

/// UTC calendar days for reports.
enum ReceiptDay {
    static func string(_ date: Date) -> String {
        String(ReceiptDate.rfc3339(date).prefix(10))
    }
}

import Foundation
@testable import PurchaseServer
import Storage
import Testing

/// The revenue report is summed by the database, one row per group: its figures must be those of the sales one by one.
@Suite("Revenue report")
struct RevenueReportTests {
    /// A sale as the test writes it into the ledger.
    struct Sale {
        var app: String, product: String, environment: String, currency: String?, price: String?
        var quantity: Int64, purchaseDate: Int64, refundedAt: Int64?, refundPercentage: Int?
    }

    /// 600 sales over five days around midnight UTC, three products, three currencies (and none), prices with more
    /// decimals than a cent, quantities up to 5, whole and prorated refunds; a second app's and earlier and later sales.
    static func sales() -> [Sale] {
        var generator = SystemRandomNumberGenerator()
        let start: Int64 = 1_767_225_600_000  // 2026-01-01T00:00:00Z
        let prices = ["0.99", "1.99", "4.49", "0.333", "12", nil]
        var sales: [Sale] = []
        for index in 0..<600 {
            let refunded = index % 7 == 0
            sales.append(Sale(app: index % 10 == 0 ? "com.example.other" : "com.example.app",
                              product: ["coins", "pass", "gloves"][index % 3], environment: index % 4 == 0 ? "Sandbox" : "Production",
                              currency: ["USD", "EUR", "JPY", nil][Int.random(in: 0..<4, using: &generator)],
                              price: prices[Int.random(in: 0..<prices.count, using: &generator)], quantity: Int64.random(in: 1...5, using: &generator),
                              // From a minute before the first day (outside the range) to a minute after the last.
                              purchaseDate: start - 60_000 + Int64.random(in: 0...(5 * 86_400_000 + 120_000), using: &generator),
                              refundedAt: refunded ? start + 6 * 86_400_000 : nil,
                              refundPercentage: refunded && index % 2 == 0 ? Int.random(in: 0...100_000, using: &generator) : nil))
        }
        return sales
    }

    /// The report computed from the sales one by one, as the server did before the database summed them.
    static func expected(_ sales: [Sale], app: String, from: Int64, to: Int64, group: [RevenueReport.Dimension]) -> (rows: [[String?]: [String]], totals: [String: Decimal]) {
        var sums: [[String?]: (Int64, Int64, Decimal, Int64, Decimal)] = [:]
        var totals: [String: Decimal] = [:]
        for sale in sales where sale.app == app && sale.purchaseDate >= from && sale.purchaseDate < to {
            let currency = sale.currency ?? "unpriced"
            let key: [String?] = group.map {
                switch $0 {
                case .day: return String(ISO8601DateFormatter().string(from: Date(timeIntervalSince1970: Double(sale.purchaseDate) / 1000)).prefix(10))
                case .product: return sale.product
                case .currency: return currency
                case .environment: return sale.environment
                }
            }
            let amount = (Decimal(string: sale.price ?? "0") ?? 0) * Decimal(sale.quantity)
            var sum = sums[key] ?? (0, 0, 0, 0, 0)
            sum.0 += 1
            sum.1 += sale.quantity
            sum.2 += amount
            totals[currency, default: 0] += amount
            if sale.refundedAt != nil {
                let share = sale.refundPercentage.map { Decimal($0) / 100_000 } ?? 1
                sum.3 += 1
                sum.4 += amount * share
                totals[currency, default: 0] -= amount * share
            }
            sums[key] = sum
        }
        return (sums.mapValues { ["\($0.0)", "\($0.1)", cents($0.2), "\($0.3)", cents($0.4), cents($0.2 - $0.4)] }, totals)
    }

    static func cents(_ value: Decimal) -> String {
        var rounded = Decimal(), copy = value
        NSDecimalRound(&rounded, &copy, 2, .plain)
        let text = "\(rounded)"
        guard let dot = text.firstIndex(of: ".") else { return text + ".00" }
        return text + String(repeating: "0", count: max(0, 3 - text.distance(from: dot, to: text.endIndex)))
    }

    @Test("Summed by the database per group, the report equals the sales counted one by one, for every grouping", arguments: Engine.available)
    func summedPerGroup(engine: Engine) async throws {
        let database = try await engine.makeDatabase()
        defer { Task { await database.close() } }
        let store = try await QueryCostTests.migrate(database)
        let sales = Self.sales()
        try await store.database.transaction { db in
            for (index, sale) in sales.enumerated() {
                try db.query("""
                    INSERT INTO ledger (environment, transaction_id, app_id, app_user_id, product_id, product_type, quantity, purchase_date,
                    original_transaction_id, price, currency, source, verification_id, cancellation_date, is_trial, recorded_at, refund_percentage)
                    VALUES (?, ?, ?, 'user', ?, 'Consumable', ?, ?, ?, ?, ?, 'receipt', 'v', ?, 0, 0, ?)
                    """, [sale.environment, "\(index)", sale.app, sale.product, sale.quantity, sale.purchaseDate, "\(index)", sale.price,
                          sale.currency, sale.refundedAt, sale.refundPercentage.map(Int64.init)])
            }
        }
        let from: Int64 = 1_767_225_600_000, to = from + 5 * 86_400_000
        let groupings: [[RevenueReport.Dimension]] = [[], [.currency], [.day], [.product, .environment], [.environment, .day, .currency, .product]]
        for group in groupings {
            let report = try await store.revenue(appId: "com.example.app", from: Date(milliseconds: from), to: Date(milliseconds: to), group: group)
            let expected = Self.expected(sales, app: "com.example.app", from: from, to: to, group: group)
            let rows = Dictionary(uniqueKeysWithValues: report.rows.map { row in
                (group.map { dimension -> String? in
                    switch dimension {
                    case .day: return row.day
                    case .product: return row.productId
                    case .currency: return row.currency
                    case .environment: return row.environment
                    }
                }, ["\(row.transactions)", "\(row.units)", row.gross, "\(row.refunds)", row.refunded, row.net])
            })
            #expect(rows == expected.rows, "grouped by \(group)")
            #expect(report.totals == expected.totals.mapValues(Self.cents), "grouped by \(group)")
            #expect(rows.values.reduce(0) { $0 + Int($1[0])! } == sales.filter { $0.app == "com.example.app" && $0.purchaseDate >= from && $0.purchaseDate < to }.count)
        }
    }
}

import Foundation
import HTTP
@testable import PurchaseServer
import Testing

@Suite("The user view written directly is what the JSON encoder writes")
struct UserViewJSONTests {
    /// Text with what JSON must escape (quotes, backslashes, a control character for each escape: NUL, \b, \t, \n, \f,
    /// \r, 0x1F), what it need not (slashes, DEL, accents, emoji, U+2028), and plain ids.
    static func text(_ random: inout SplitMix64) -> String {
        let pieces = ["", "a", "Z", "coins", "gold_coins", "com.example.monthly", "\"", "\\", "/", "\u{7f}", "é", "e\u{301}", "Ω", "🪙", "\u{2028}",
                      " ", "%", "\u{0}", "\u{8}", "\u{c}", "\n", "\r", "\t", "\u{1f}", "10", "9", "B", "b"]
        return (0..<Int.random(in: 0...4, using: &random)).map { _ in pieces.randomElement(using: &random)! }.joined()
    }

    static func number(_ random: inout SplitMix64) -> Int64 {
        [Int64.min, -1, 0, 1, 1_700_000_000_000, Int64.max, Int64.random(in: -1_000_000...1_000_000, using: &random)].randomElement(using: &random)!
    }

    static func maybe<T>(_ random: inout SplitMix64, _ make: (inout SplitMix64) -> T) -> T? {
        Bool.random(using: &random) ? make(&random) : nil
    }

    static func view(_ random: inout SplitMix64) -> UserView {
        UserView(
            appUserId: text(&random),
            entitlements: (0..<Int.random(in: 0...3, using: &random)).map { _ in
                UserView.Entitlement(id: text(&random), active: Bool.random(using: &random), expiresDate: maybe(&random, number),
                                     source: text(&random), productId: text(&random), environment: text(&random))
            },
            balances: Dictionary((0..<Int.random(in: 0...5, using: &random)).map { _ in (text(&random), number(&random)) }, uniquingKeysWith: { $1 }),
            subscriptions: (0..<Int.random(in: 0...3, using: &random)).map { _ in
                UserView.Subscription(originalTransactionId: text(&random), productId: text(&random), state: text(&random),
                                      expiresDate: maybe(&random, number), autoRenewStatus: maybe(&random) { Bool.random(using: &$0) },
                                      autoRenewProductId: maybe(&random, text), environment: text(&random),
                                      priceIncreaseStatus: maybe(&random, number))
            },
            transactions: (0..<Int.random(in: 0...3, using: &random)).map { _ in
                UserView.Transaction(transactionId: text(&random), originalTransactionId: text(&random), productId: text(&random),
                                     productType: text(&random), quantity: number(&random), purchaseDate: number(&random),
                                     expiresDate: maybe(&random, number), cancellationDate: maybe(&random, number), environment: text(&random),
                                     verificationId: text(&random))
            },
            flagged: Bool.random(using: &random), flagReason: maybe(&random, text))
    }

    @Test("2,000 random views: the same bytes as Response.encoder, and JSON that decodes back to the view")
    func sameBytes() throws {
        var random = SplitMix64(state: 20261202)
        for _ in 0..<2_000 {
            let view = Self.view(&random)
            let written = view.json()
            let encoded = Array(try Response.encoder.encode(view))
            #expect(written == encoded, "\(String(decoding: written, as: UTF8.self))\n\(String(decoding: encoded, as: UTF8.self))")
            #expect(try JSONDecoder().decode(UserView.self, from: Data(written)) == view)
            if written != encoded { return }
        }
    }

    @Test("An empty view: every key but flagReason, empty lists and an empty balances object")
    func empty() {
        let view = UserView(appUserId: "u", entitlements: [], balances: [:], subscriptions: [], transactions: [], flagged: false, flagReason: nil)
        #expect(String(decoding: view.json(), as: UTF8.self)
                == #"{"appUserId":"u","balances":{},"entitlements":[],"flagged":false,"subscriptions":[],"transactions":[]}"#)
    }
}

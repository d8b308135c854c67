import Foundation
@testable import PurchaseServer
import Testing

@Suite("Settlement summaries")
struct SettlementResultTests {
    @Test("The stored summary reads back as the same result, quotes and control characters included")
    func roundTrip() throws {
        var result = SettlementResult()
        result.granted = ["1000000001", "1000000002"]
        result.alreadyOwned = ["1000000003"]
        result.refused = [.init(transactionId: "1000000004", productId: "gloves", code: "replay_refused",
                                reason: "transaction \"1000000004\" is bound to another user\n\tline two \\ end")]
        result.unknownProducts = ["com.example.ünknown"]
        result.revoked = []
        let decoded = try JSONDecoder().decode(SettlementResult.self, from: Data(result.jsonText.utf8))
        #expect(decoded == result)
        #expect(try JSONDecoder().decode(SettlementResult.self, from: Data(SettlementResult().jsonText.utf8)) == SettlementResult())
    }
}

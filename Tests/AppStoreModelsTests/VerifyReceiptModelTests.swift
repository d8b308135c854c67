import AppStoreModels
import Foundation
import Testing

@Suite("verifyReceipt wire format")
struct VerifyReceiptModelTests {
    @Test("Both spellings of the retry flag are read, as booleans or numbers",
          arguments: [#"{"status":21100,"is_retryable":true}"#, #"{"status":21100,"is-retryable":1}"#])
    func retryFlag(json: String) throws {
        let response = try JSONDecoder().decode(VerifyReceiptResponse.self, from: Data(json.utf8))
        #expect(response.status == 21100)
        #expect(response.isRetryable == true)
    }

    @Test("Responses emit is_retryable and string-typed transaction fields")
    func encoding() throws {
        let purchase = InAppPurchase(productId: "coins", transactionId: "2000000000000001", purchaseDate: Date(timeIntervalSince1970: 1_375_340_400))
        let response = VerifyReceiptResponse(status: 0, environment: .sandbox, latestReceiptInfo: [ReceiptTransactionInfo(purchase)], isRetryable: false)
        let object = try #require(try JSONSerialization.jsonObject(with: JSONEncoder().encode(response)) as? [String: Any])
        #expect(object["is_retryable"] as? Bool == false)
        let entry = try #require((object["latest_receipt_info"] as? [[String: Any]])?.first)
        #expect(entry["quantity"] as? String == "1")
        #expect(entry["purchase_date_ms"] as? String == "1375340400000")
        #expect(entry["purchase_date"] as? String == "2013-08-01 07:00:00 Etc/GMT")
    }

    @Test("Request flags are read from booleans, numbers and strings")
    func requestFlags() throws {
        for json in [#"{"receipt-data":"x","exclude-old-transactions":true}"#, #"{"receipt-data":"x","exclude-old-transactions":1}"#, #"{"receipt-data":"x","exclude-old-transactions":"true"}"#] {
            #expect(try JSONDecoder().decode(VerifyReceiptRequest.self, from: Data(json.utf8)).excludeOldTransactions == true)
        }
    }
}

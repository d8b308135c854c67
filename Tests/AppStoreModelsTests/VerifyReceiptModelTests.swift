import AppStoreModels
import Foundation
import Testing

@Suite("verifyReceipt wire format")
struct VerifyReceiptModelTests {
    @Test("Both spellings of the retry flag are read, as booleans or numbers",
          arguments: [#"{"status":21100,"is_retryable":true}"#, #"{"status":21100,"is-retryable":1}"#])
    func retryFlag(json: String) throws {
        let response = try VerifyReceiptResponse(jsonBytes: Data(json.utf8))
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

@Suite("Fast JSON writer")
struct JSONBufferTests {
    @Test("The hand-written verifyReceipt JSON equals the Codable rendering, escaping included")
    func matchesCodable() throws {
        let date = Date(timeIntervalSince1970: 1_439_189_372)
        var purchase = InAppPurchase(productId: "monthly", transactionId: "1", originalTransactionId: "1", purchaseDate: date,
                                     originalPurchaseDate: date, expiresDate: date.addingTimeInterval(300), webOrderLineItemId: 7,
                                     cancellationDate: date, cancellationReason: 1, isTrialPeriod: true, isInIntroOfferPeriod: false)
        purchase.promotionalOfferId = "quote\" backslash\\ newline\n tab\t bell\u{07} 中文"
        let receipt = AppReceipt(receiptType: .productionSandbox, bundleId: "com.example/\"x\"", applicationVersion: "1", creationDate: date,
                                 originalPurchaseDate: date, originalApplicationVersion: "1.0", inApp: [purchase])
        var info = ReceiptTransactionInfo(purchase)
        info.subscriptionGroupIdentifier = "2100"
        info.inAppOwnershipType = "PURCHASED"
        let response = VerifyReceiptResponse(status: 0, environment: .sandbox, receipt: ReceiptInfo(receipt, requestDate: date),
                                             latestReceiptInfo: [info, info], latestReceipt: "abc+/=",
                                             pendingRenewalInfo: [PendingRenewalInfo(autoRenewProductId: "m", autoRenewStatus: "0", productId: "m",
                                                                                     originalTransactionId: "1", expirationIntent: "1")],
                                             isRetryable: false)
        let fast = try JSONSerialization.jsonObject(with: Data(response.jsonBytes())) as? NSDictionary
        let codable = try JSONSerialization.jsonObject(with: JSONEncoder().encode(response)) as? NSDictionary
        #expect(fast != nil)
        #expect(fast == codable)
    }

    @Test("Strings are escaped wherever their quote, backslash or control character falls (eight bytes at a time before it): every position of strings of 0-39 characters")
    func escapesAnywhere() throws {
        var generator = SystemRandomNumberGenerator()
        let plain = Array("abcdefghijklmnopqrstuvwxyz0123456789+/=é😀".unicodeScalars)
        let specials = ["", "\"", "\\", "\n", "\u{0}", "\u{1f}"]
        for length in 0..<40 {
            for (special, position) in specials.flatMap({ special in (0...length).map { (special, $0) } }) {
                var text = String(String.UnicodeScalarView((0..<length).map { _ in plain.randomElement(using: &generator)! }))
                text.unicodeScalars.insert(contentsOf: special.unicodeScalars,
                                           at: text.unicodeScalars.index(text.unicodeScalars.startIndex, offsetBy: position))
                var buffer = JSONBuffer()
                buffer.object { $0.key("s"); $0.string(text) }
                // Foundation's reader refuses a raw control character or a bare quote: what it reads back is what was written.
                let read = try JSONSerialization.jsonObject(with: Data(buffer.bytes)) as? [String: String]
                #expect(read == ["s": text], "length \(length), \(special.debugDescription) at \(position)")
            }
        }
    }
}

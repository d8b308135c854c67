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

    @Test("A decoded receipt's in_app entries are written straight from its purchases, byte for byte as their rendered entries are")
    func directEntriesMatchRendered() throws {
        var generator = SystemRandomNumberGenerator()
        // Every span the writer treats apart: before 1970, before 2007 (the time zone database's offsets), around daylight
        // saving's changes, fractions of a millisecond, a Pacific year outside 0…9999 on either side of a UTC one inside it,
        // years past 9999 and dates no integer holds (saturated).
        // Daylight saving starts and ends at 10:00 and 09:00 UTC: each change is tried at its second and the one before.
        let edges: [Double] = [0, -1, -86_400.5, 1_173_607_199, 1_173_607_200, 1_194_166_799, 1_194_166_800, 1_741_514_399.999,
                               1_741_514_400, 1_762_073_999, 1_762_074_000,
                               253_402_300_799.999, 253_402_300_800, 253_402_304_400, -62_167_215_600, -62_167_219_201, 1e17, -1e17, 1e300, -1e300, .infinity, -.infinity, .nan]
        // Four dates in seven fall within three days of one daylight saving change, so the writer's remembered days are met
        // again in UTC and in Pacific time, in every order, and left for others.
        func someDate() -> Date? {
            switch Int.random(in: 0..<8, using: &generator) {
            case 0: nil
            case 1: Date(timeIntervalSince1970: edges.randomElement(using: &generator)!)
            case 2, 3: Date(timeIntervalSince1970: Double.random(in: -4e9...4e10, using: &generator))
            default: Date(timeIntervalSince1970: 1_741_514_400 + Double.random(in: -259_200...259_200, using: &generator))
            }
        }
        let texts = ["", "coins", "com.example.coins.100", "quote\" backslash\\ nul\u{0} é 😀", String(repeating: "x", count: 300)]
        let purchases = (0..<2_000).map { _ in
            InAppPurchase(quantity: Int.random(in: -1...1_000_000, using: &generator), productId: texts.randomElement(using: &generator)!,
                          transactionId: String(UInt64.random(in: 0...UInt64.max, using: &generator)),
                          originalTransactionId: Bool.random(using: &generator) ? nil : texts.randomElement(using: &generator)!,
                          purchaseDate: someDate(), originalPurchaseDate: someDate(), expiresDate: someDate(),
                          webOrderLineItemId: Bool.random(using: &generator) ? nil : [Int64.min, -1, 0, Int64.max, 1_000_000_123].randomElement(using: &generator)!,
                          cancellationDate: someDate(), cancellationReason: Bool.random(using: &generator) ? nil : Int.random(in: -1...1, using: &generator),
                          isTrialPeriod: Bool.random(using: &generator), isInIntroOfferPeriod: [nil, true, false].randomElement(using: &generator)!,
                          promotionalOfferId: Bool.random(using: &generator) ? nil : texts.randomElement(using: &generator)!)
        }
        let receipt = AppReceipt(receiptType: .productionSandbox, bundleId: "com.example.coins", applicationVersion: "1",
                                 creationDate: someDate(), inApp: purchases)
        let direct = ReceiptInfo(receipt, requestDate: Date(timeIntervalSince1970: 1_764_000_000))
        var rendered = direct
        rendered.inApp = purchases.map(ReceiptTransactionInfo.init)
        let written = VerifyReceiptResponse(status: 0, environment: .sandbox, receipt: direct).jsonBytes()
        let expected = VerifyReceiptResponse(status: 0, environment: .sandbox, receipt: rendered).jsonBytes()
        #expect(written.count > 2_000 * 100)
        #expect(written == expected, "the first difference at byte \(zip(written, expected).enumerated().first { $0.element.0 != $0.element.1 }?.offset ?? min(written.count, expected.count))")
        #expect(direct == rendered && direct.inApp == rendered.inApp)
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

import AppStoreModels
import Foundation
import Testing

@Suite("Receipt dates")
struct ReceiptDateTests {
    @Test("Sandbox original purchase date renders in all three verifyReceipt forms")
    func sandboxOriginalPurchaseDate() {
        let date = Date(timeIntervalSince1970: 1_375_340_400)
        #expect(ReceiptDate.gmtString(date) == "2013-08-01 07:00:00 Etc/GMT")
        #expect(ReceiptDate.pacificString(date) == "2013-08-01 00:00:00 America/Los_Angeles")
        #expect(ReceiptDate.milliseconds(date) == 1_375_340_400_000)
        #expect(ReceiptDate.rfc3339(date) == "2013-08-01T07:00:00Z")
    }

    @Test("Pacific time follows daylight saving time")
    func pacificWinterTime() {
        // 2015-11-18 04:34:41 UTC is standard time (UTC−8), from the real r12 response.
        let date = Date(timeIntervalSince1970: 1_447_821_281)
        #expect(ReceiptDate.pacificString(date) == "2015-11-17 20:34:41 America/Los_Angeles")
    }

    @Test("RFC 3339 parsing accepts Z, ±HH:MM and ±HHMM offsets and rejects junk",
          arguments: [
              ("2020-07-22T18:33:15Z", 1_595_442_795.0),
              ("2020-07-22T18:33:15+0100", 1_595_439_195.0),
              ("2020-07-22T18:33:15+01:00", 1_595_439_195.0),
              ("2020-07-22T18:33:15-07:00", 1_595_442_795.0 + 25_200),
          ])
    func parsesOffsets(text: String, expected: Double) {
        #expect(ReceiptDate.parseRFC3339(text)?.timeIntervalSince1970 == expected)
    }

    @Test("Empty and malformed dates are absent", arguments: ["", "2020-13-01T00:00:00Z", "yesterday", "2020-07-22T18:33:15+1", "2020-07-22 18:33"])
    func rejectsMalformed(text: String) {
        #expect(ReceiptDate.parseRFC3339(text) == nil)
    }

    @Test("Round trip through RFC 3339 keeps whole seconds")
    func roundTrip() {
        let date = Date(timeIntervalSince1970: 4_102_444_799)
        #expect(ReceiptDate.parseRFC3339(ReceiptDate.rfc3339(date)) == date)
    }
}

@Suite("Pacific time")
struct PacificTimeTests {
    @Test("The fast daylight-saving rule agrees with the time zone database, 2007–2060")
    func agreesWithTimeZone() {
        let zone = TimeZone(identifier: "America/Los_Angeles")!
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = zone
        // Every hour around each transition, and random instants.
        var instants: [Double] = (0..<3000).map { _ in Double.random(in: 1_167_609_600...2_871_763_200).rounded(.down) }
        for year in 2007...2060 {
            for month in [3, 11] {
                let start = calendar.date(from: DateComponents(year: year, month: month, day: 1))!.timeIntervalSince1970
                instants += stride(from: start, to: start + 15 * 86400, by: 1800).map { $0 }
            }
        }
        for instant in instants {
            let date = Date(timeIntervalSince1970: instant)
            let components = calendar.dateComponents([.year, .month, .day, .hour, .minute, .second], from: date)
            let expected = String(format: "%04d-%02d-%02d %02d:%02d:%02d America/Los_Angeles", components.year!, components.month!, components.day!,
                                  components.hour!, components.minute!, components.second!)
            #expect(ReceiptDate.pacificString(date) == expected)
        }
    }
}

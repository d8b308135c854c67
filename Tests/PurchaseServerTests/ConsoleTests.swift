import AppStoreCrypto
import Foundation
@testable import PurchaseServer
import Testing

/// The console's rules that need no browser: escaping, the CSV export, passwords, the sign-in throttle, roles.
@Suite("Console")
struct ConsoleTests {
    @Test("Every value put into a page is escaped; markup is not")
    func escaping() {
        let hostile = "<script>alert('x')</script>\"&"
        let page: HTML = "<p title=\"\(hostile)\">\(hostile)</p>\(HTML(raw: "<b>ok</b>"))"
        #expect(page.text == "<p title=\"&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&quot;&amp;\">&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&quot;&amp;</p><b>ok</b>")
        #expect(HTML.escape("a\u{0}b") == "a\u{FFFD}b")
        #expect(HTML.urlComponent("a b/c?d&e") == "a%20b%2Fc%3Fd%26e")
    }

    @Test("CSV cells are all quoted; formulas stay text, even behind a combining mark or a prepended scalar")
    func csv() {
        func listing(_ user: String) -> TransactionListing {
            TransactionListing(transaction: UserView.Transaction(transactionId: "1", originalTransactionId: "1", productId: "p", productType: "consumable",
                                                                  quantity: 1, purchaseDate: 0, expiresDate: nil, cancellationDate: nil,
                                                                  environment: "Sandbox", verificationId: "v"), appUserId: user, price: "0.99", currency: "USD")
        }
        let text = ConsolePages.transactionsCSV([listing("=cmd|' /C calc'!A0"), listing("x,\u{301}y"), listing("\u{600},=1+1"), listing("say \"hi\"")])
        let lines = text.components(separatedBy: "\r\n")
        #expect(lines[1].contains("\"'=cmd|' /C calc'!A0\""))
        #expect(lines[2].contains("\"x,\u{301}y\""))
        #expect(lines[3].contains("\"\u{600},=1+1\""))
        #expect(lines[4].contains("\"say \"\"hi\"\"\""))
        #expect(lines.count == 6 && lines[5].isEmpty)
    }

    @Test("Passwords: scrypt round trip; wrong ones and hostile stored records never match and never trap")
    func passwords() throws {
        let stored = try PasswordHash.make("correct horse")
        #expect(stored.hasPrefix("scrypt$32768$8$1$"))
        #expect(PasswordHash.verify("correct horse", against: stored))
        #expect(!PasswordHash.verify("correct hors", against: stored))
        let parts = stored.split(separator: "$")
        for hostile in ["", "scrypt", "scrypt$$$$$", "scrypt$1048576$16$4$00$00", "scrypt$32768$8$1$é0$\(parts[5])",
                        "scrypt$32768$8$1$ab\r\n$\(parts[5])", "scrypt$32769$8$1$\(parts[4])$\(parts[5])", "scrypt$32768$8$1$\(parts[4])$zz",
                        "md5$x"] {
            #expect(!PasswordHash.verify("correct horse", against: hostile), "\(hostile)")
        }
        #expect(!PasswordHash.verify(String(repeating: "x", count: 2000), against: stored))
    }

    @Test("The throttle: five attempts per address in 15 minutes whatever its spelling, a success forgiven, a spray stopped")
    func throttle() {
        let throttle = LoginThrottle()
        let now = Date(timeIntervalSince1970: 1_800_000_000)
        for _ in 0..<4 { #expect(throttle.begin("a@x.io", now: now)) }
        #expect(throttle.begin("a@x.io", now: now))
        throttle.succeeded("a@x.io")
        #expect(throttle.begin("A@X.IO", now: now))
        #expect(!throttle.begin("a@x.io", now: now))
        #expect(throttle.begin("a@x.io", now: now.addingTimeInterval(15 * 60 + 1)))
        let spray = LoginThrottle()
        for index in 0..<100 { #expect(spray.begin("user\(index)@x.io", now: now)) }
        #expect(!spray.begin("someone@x.io", now: now))
        #expect(Operator.normalizedEmail("  Admin@Example.COM ") == "admin@example.com")
        for bad in ["", "@", "a@", "@b", "a b@c", "a@b@c", "a\u{0}@b", "é@x.io"] { #expect(Operator.normalizedEmail(bad) == nil, "\(bad)") }
    }

    @Test("Roles: support never sees settings or metrics, finance never acts on customers, the emulator page only beside an emulator")
    func roles() {
        #expect(OperatorRole.support.may(.customers) && !OperatorRole.support.may(.settings) && !OperatorRole.support.may(.metrics))
        #expect(OperatorRole.finance.may(.metrics) && OperatorRole.finance.may(.transactions) && !OperatorRole.finance.may(.customers))
        #expect(OperatorRole.developer.may(.webhooks) && !OperatorRole.developer.may(.operators))
        #expect(ConsolePage.allCases.allSatisfy { OperatorRole.admin.may($0) })
        var session = ConsoleSession(operatorInfo: Operator(email: "d@x.io", role: .developer, hasPassword: true, createdAt: 0), csrf: "c", expiresAt: 0)
        #expect(!session.pages.contains(.emulator))
        session.emulatorAttached = true
        #expect(session.pages.contains(.emulator))
    }

    @Test("Form values are cut by bytes, never inside a scalar")
    func bounds() {
        #expect(PurchaseServerResponder.bounded("abc", bytes: 2) == "ab")
        #expect(PurchaseServerResponder.bounded("e\u{301}\u{301}\u{301}", bytes: 3) == "e\u{301}")
        #expect(PurchaseServerResponder.bounded(nil, bytes: 3) == "")
    }
}

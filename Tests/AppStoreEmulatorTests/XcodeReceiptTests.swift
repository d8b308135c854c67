import AppStoreCrypto
@testable import AppStoreEmulator
import AppStoreModels
import Foundation
import StorekeeperTesting
import Testing

/// Xcode testers' app receipts are laid out as Xcode's StoreKit Testing writes them, so a backend's receipt
/// parser meets Xcode's BER and its self-signed signer, and verifyReceipt refuses them as Apple does.
@Suite("Xcode receipts")
struct XcodeReceiptTests {
    @Test("An Xcode tester's receipt is BER with indefinite lengths, receipt type Xcode, signed by one self-signed StoreKit certificate")
    func layout() async throws {
        let world = try await World.make()
        try await world.emulator.addAccount(email: "xcode@example.com", environment: .sandbox, xcode: true)
        let device = try await world.emulator.signIn(deviceId: nil, email: "xcode@example.com")
        #expect(try await world.emulator.appReceipt(bundleId: "com.example.coins", deviceId: device.id) == nil, "no receipt before the first purchase")
        let bought = try await world.buy("com.example.magazine", "com.example.magazine.monthly", device: device.id)
        let bytes = [UInt8](try #require(try await world.emulator.appReceipt(bundleId: "com.example.magazine", deviceId: device.id)))
        #expect(Array(bytes.prefix(2)) == [0x30, 0x80], "an indefinite-length SEQUENCE, as Xcode writes")
        #expect(Array(bytes.suffix(2)) == [0, 0])
        guard case .app(let receipt, let signed) = try ReceiptDecoder.decode(bytes) else {
            Issue.record("not an app receipt")
            return
        }
        #expect(receipt.receiptType == .xcode && receipt.appItemId == 0 && receipt.originalApplicationVersion == nil)
        #expect(receipt.opaqueValue.count == 8 && receipt.expirationDate.map(ReceiptDate.rfc3339) == "4001-01-01T00:00:00Z")
        #expect(receipt.inApp.map(\.transactionId) == [bought.id] && receipt.inApp.first?.originalTransactionId == nil)
        #expect(signed.certificates.count == 1)
        let signer = try signed.signerCertificate()
        #expect(signer.der == TestSupport.xcodeAuthority.receiptCertificate?.der)
        try signed.verifySignature(with: signer)  // the signature itself is good…
        // …but the signer is not Apple's: verifyReceipt answers as for any receipt it did not issue.
        let answer = try await world.verify(Data(bytes).base64EncodedString())
        #expect(answer.status != 0 && answer.inApp.isEmpty)
    }
}

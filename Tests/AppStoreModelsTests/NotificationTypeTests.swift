import AppStoreModels
import Foundation
import Testing

@Suite("Notification types")
struct NotificationTypeTests {
    @Test("Known and unknown types code as their bare string and compare by it")
    func coding() throws {
        let types = [NotificationType.refundReversed, NotificationType("SOMETHING_NEW")]
        let data = try JSONEncoder().encode(types)
        #expect(String(decoding: data, as: UTF8.self) == #"["REFUND_REVERSED","SOMETHING_NEW"]"#)
        #expect(try JSONDecoder().decode([NotificationType].self, from: data) == types)
        #expect(NotificationType(rawValue: "DID_RENEW") == .didRenew && NotificationSubtype("SUMMARY") == .summary)
        #expect("\(NotificationType.test)" == "TEST")
    }
}

import AppStoreModels
import Foundation

/// Access to model helpers from inside this module.
enum AppStoreModelsBridge {
    static func parseRFC3339(_ text: String) -> Date? { ReceiptDate.parseRFC3339(text) }
}

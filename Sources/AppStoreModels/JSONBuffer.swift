import Foundation

/// A small, allocation-light JSON writer for the hot verifyReceipt path (Foundation's JSONEncoder
/// costs several microseconds per field there). Keys are written in the order given, as Apple does.
public struct JSONBuffer {
    /// The UTF-8 bytes written so far.
    public private(set) var bytes: [UInt8] = []
    private var first = true
    /// Calendar dates of the days that dates were last written on.
    private var recentDays = ReceiptDate.RecentDays()

    /// Creates an empty buffer with room for `capacity` bytes.
    public init(capacity: Int = 1024) { bytes.reserveCapacity(capacity) }

    /// `{ … }`
    public mutating func object(_ body: (inout JSONBuffer) -> Void) {
        bytes.append(UInt8(ascii: "{"))
        first = true
        body(&self)
        bytes.append(UInt8(ascii: "}"))
        first = false
    }

    /// `[ … ]` of objects or values written by `body` for each element.
    public mutating func array<C: Collection>(_ elements: C, _ body: (inout JSONBuffer, C.Element) -> Void) {
        bytes.append(UInt8(ascii: "["))
        var index = 0
        for element in elements {
            if index > 0 { bytes.append(UInt8(ascii: ",")) }
            first = true
            body(&self, element)
            index += 1
        }
        bytes.append(UInt8(ascii: "]"))
        first = false
    }

    /// Writes `"key":` after a comma where needed.
    public mutating func key(_ key: String) {
        if !first { bytes.append(UInt8(ascii: ",")) }
        first = false
        string(key)
        bytes.append(UInt8(ascii: ":"))
    }

    /// A string value, escaped.
    public mutating func string(_ value: String) {
        bytes.append(UInt8(ascii: "\""))
        // Most values need no escaping: copy them in one go (scanning the contiguous UTF-8 directly;
        // a receipt's kilobytes of Base64 pass through here on every verifyReceipt call).
        let clean = value.utf8.withContiguousStorageIfAvailable { buffer -> Bool in
            if JSONBytes.needsEscaping(buffer) { return false }
            bytes.append(contentsOf: buffer)
            return true
        }
        if clean == true {
            bytes.append(UInt8(ascii: "\""))
            return
        }
        for byte in value.utf8 {
            switch byte {
            case UInt8(ascii: "\""): bytes.append(contentsOf: [92, 34])
            case UInt8(ascii: "\\"): bytes.append(contentsOf: [92, 92])
            case 0x08: bytes.append(contentsOf: [92, 98])
            case 0x0c: bytes.append(contentsOf: [92, 102])
            case 0x0a: bytes.append(contentsOf: [92, 110])
            case 0x0d: bytes.append(contentsOf: [92, 114])
            case 0x09: bytes.append(contentsOf: [92, 116])
            case 0..<0x20:
                let hex = Array("0123456789abcdef".utf8)
                bytes.append(contentsOf: [92, 117, 48, 48, hex[Int(byte >> 4)], hex[Int(byte & 0xf)]])
            default: bytes.append(byte)
            }
        }
        bytes.append(UInt8(ascii: "\""))
    }

    /// `"key":<json>` with `json` already valid JSON text (written as is).
    public mutating func field(_ name: String, rawJSON json: String) {
        key(name)
        bytes.append(contentsOf: json.utf8)
    }

    /// `"key":"value"`
    public mutating func field(_ name: String, _ value: String) {
        key(name)
        string(value)
    }

    /// `"key":"value"` when the value is present.
    public mutating func field(_ name: String, _ value: String?) {
        if let value { field(name, value) }
    }

    /// `"key":123`
    public mutating func field(_ name: String, _ value: Int64) {
        key(name)
        bytes.append(contentsOf: String(value).utf8)
    }

    /// `"key":123` when the value is present.
    public mutating func field(_ name: String, _ value: Int64?) {
        if let value { field(name, value) }
    }

    /// `"key":true`
    public mutating func field(_ name: String, _ value: Bool) {
        key(name)
        bytes.append(contentsOf: (value ? "true" : "false").utf8)
    }

    /// `"key":true` when the value is present.
    public mutating func field(_ name: String, _ value: Bool?) {
        if let value { field(name, value) }
    }

    /// `"key":123`, or `"key":null` when the value is absent.
    public mutating func field(_ name: String, orNull value: Int64?) {
        if let value { field(name, value) } else { field(name, rawJSON: "null") }
    }

    /// The three forms of a date: `name`, `name_ms`, `name_pst`.
    public mutating func field(_ name: String, _ triple: ReceiptDateTriple?) {
        guard let triple else { return }
        field(name, triple.gmt)
        field(name + "_ms", triple.milliseconds)
        field(name + "_pst", triple.pacific)
    }
}

extension JSONBuffer {
    /// `"key":` (or `"key<suffix>":`) for a key of ours that needs no escaping, after a comma where needed.
    mutating func key(literal key: StaticString, suffix: StaticString = "") {
        let room = key.utf8CodeUnitCount + suffix.utf8CodeUnitCount + 4
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: room) { buffer in
            var out = ByteWriter(buffer)
            if !first { out.put(UInt8(ascii: ",")) }
            out.put(UInt8(ascii: "\""))
            out.put(key)
            out.put(suffix)
            out.put(UInt8(ascii: "\""))
            out.put(UInt8(ascii: ":"))
            bytes.append(contentsOf: out.written)
        }
        first = false
    }

    /// `"key":"value"`
    mutating func field(literal name: StaticString, _ value: String) {
        key(literal: name)
        string(value)
    }

    /// `"key":"123"`: a number written as a string, as verifyReceipt writes them.
    mutating func field(literal name: StaticString, quoted value: Int64) {
        key(literal: name)
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 23) { buffer in
            var out = ByteWriter(buffer)
            out.put(UInt8(ascii: "\""))
            out.put(decimal: value)
            out.put(UInt8(ascii: "\""))
            bytes.append(contentsOf: out.written)
        }
    }

    /// `"key":"true"` or `"key":"false"`, as verifyReceipt writes flags.
    mutating func field(literal name: StaticString, quoted value: Bool) {
        key(literal: name)
        bytes.append(contentsOf: (value ? "\"true\"" : "\"false\"").utf8)
    }

    /// A date's three forms, `name`, `name_ms` and `name_pst`, written straight from the date: the bytes that
    /// `field(name, ReceiptDateTriple(date))` writes, assembled in one piece without making the triple's three strings.
    mutating func field(literal name: StaticString, date: Date) {
        let seconds = ReceiptDate.seconds(date)
        guard let gmt = ReceiptDate.CivilTime(seconds: seconds, days: &recentDays),
              let pacific = ReceiptDate.CivilTime(seconds: seconds &+ ReceiptDate.pacificOffset(seconds, year: gmt.year), days: &recentDays) else {
            // A year outside 0…9999 (a saturated date) is written in full, which the fixed room below does not allow for.
            field(name.description, ReceiptDateTriple(date))
            return
        }
        let gmtSuffix: StaticString = " Etc/GMT\"", pacificSuffix: StaticString = " America/Los_Angeles\""
        // Three keys (a comma, quotes, the name, a suffix of at most four, a colon), two dates and twenty digits, quoted.
        let room = 3 * (name.utf8CodeUnitCount + 8) + 2 * ReceiptDate.CivilTime.length + gmtSuffix.utf8CodeUnitCount
            + pacificSuffix.utf8CodeUnitCount + 24
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: room) { buffer in
            var out = ByteWriter(buffer)
            func key(_ suffix: StaticString, comma: Bool) {
                if comma { out.put(UInt8(ascii: ",")) }
                out.put(UInt8(ascii: "\""))
                out.put(name)
                out.put(suffix)
                out.put(UInt8(ascii: "\""))
                out.put(UInt8(ascii: ":"))
                out.put(UInt8(ascii: "\""))
            }
            key("", comma: !first)
            out.put(civil: gmt)
            out.put(gmtSuffix)
            key("_ms", comma: true)
            out.put(decimal: ReceiptDate.milliseconds(date))
            out.put(UInt8(ascii: "\""))
            key("_pst", comma: true)
            out.put(civil: pacific)
            out.put(pacificSuffix)
            bytes.append(contentsOf: out.written)
        }
        first = false
    }
}

/// Writes into a buffer its caller sized for what it writes, so that a field is appended to the answer in one piece.
struct ByteWriter {
    private let buffer: UnsafeMutableBufferPointer<UInt8>
    private var count = 0

    init(_ buffer: UnsafeMutableBufferPointer<UInt8>) { self.buffer = buffer }

    /// The bytes written so far.
    var written: UnsafeMutableBufferPointer<UInt8> { UnsafeMutableBufferPointer(rebasing: buffer[..<count]) }

    mutating func put(_ byte: UInt8) {
        buffer[count] = byte
        count += 1
    }

    mutating func put(_ text: StaticString) {
        text.withUTF8Buffer { text in
            guard let source = text.baseAddress, let target = buffer.baseAddress else { return }
            (target + count).update(from: source, count: text.count)
            count += text.count
        }
    }

    /// The Base-10 digits of `value` (with a minus sign when negative): at most twenty bytes.
    mutating func put(decimal value: Int64) {
        if value < 0 { put(45) }
        var magnitude = value.magnitude
        var digits = 1
        var power: UInt64 = 10
        while digits < 20, magnitude >= power {
            digits += 1
            power = power.multipliedReportingOverflow(by: 10).partialValue
        }
        for index in stride(from: count + digits - 1, through: count, by: -1) {
            buffer[index] = UInt8(truncatingIfNeeded: 48 + magnitude % 10)
            magnitude /= 10
        }
        count += digits
    }

    /// `YYYY-MM-DD HH:MM:SS`: nineteen bytes.
    mutating func put(civil time: ReceiptDate.CivilTime) {
        time.write(separator: 32, into: UnsafeMutableBufferPointer(rebasing: buffer[count..<(count + ReceiptDate.CivilTime.length)]))
        count += ReceiptDate.CivilTime.length
    }
}

extension InAppPurchase {
    /// Writes the purchase as verifyReceipt renders it in `receipt.in_app`, straight from its fields: the bytes that
    /// `ReceiptTransactionInfo(self).write(to:)` writes, without the strings that entry would hold (up to thirteen, and
    /// three for each of its four dates). A receipt of a thousand purchases is answered this way.
    public func writeReceiptEntry(to json: inout JSONBuffer) {
        json.object { json in
            json.field(literal: "quantity", quoted: Int64(quantity))
            json.field(literal: "product_id", productId)
            json.field(literal: "transaction_id", transactionId)
            if let originalTransactionId { json.field(literal: "original_transaction_id", originalTransactionId) }
            if let purchaseDate { json.field(literal: "purchase_date", date: purchaseDate) }
            if let originalPurchaseDate { json.field(literal: "original_purchase_date", date: originalPurchaseDate) }
            if let expiresDate { json.field(literal: "expires_date", date: expiresDate) }
            if let webOrderLineItemId { json.field(literal: "web_order_line_item_id", quoted: webOrderLineItemId) }
            json.field(literal: "is_trial_period", quoted: isTrialPeriod)
            if let isInIntroOfferPeriod { json.field(literal: "is_in_intro_offer_period", quoted: isInIntroOfferPeriod) }
            if let cancellationDate { json.field(literal: "cancellation_date", date: cancellationDate) }
            if let cancellationReason { json.field(literal: "cancellation_reason", quoted: Int64(cancellationReason)) }
            if let promotionalOfferId { json.field(literal: "promotional_offer_id", promotionalOfferId) }
        }
    }
}

extension ReceiptTransactionInfo {
    /// Writes the entry as verifyReceipt does.
    public func write(to json: inout JSONBuffer) {
        json.object { json in
            json.field("quantity", quantity)
            json.field("product_id", productId)
            json.field("transaction_id", transactionId)
            json.field("original_transaction_id", originalTransactionId)
            json.field("purchase_date", purchaseDate)
            json.field("original_purchase_date", originalPurchaseDate)
            json.field("expires_date", expiresDate)
            json.field("web_order_line_item_id", webOrderLineItemId)
            json.field("is_trial_period", isTrialPeriod)
            json.field("is_in_intro_offer_period", isInIntroOfferPeriod)
            json.field("cancellation_date", cancellationDate)
            json.field("cancellation_reason", cancellationReason)
            json.field("promotional_offer_id", promotionalOfferId)
            json.field("in_app_ownership_type", inAppOwnershipType)
            json.field("subscription_group_identifier", subscriptionGroupIdentifier)
            json.field("is_upgraded", isUpgraded)
            json.field("app_account_token", appAccountToken)
        }
    }
}

extension ReceiptInfo {
    /// Writes the `receipt` object as verifyReceipt does.
    public func write(to json: inout JSONBuffer) {
        json.object { json in
            json.field("receipt_type", receiptType)
            json.field("adam_id", adamId)
            json.field("app_item_id", appItemId)
            json.field("bundle_id", bundleId)
            json.field("application_version", applicationVersion)
            json.field("download_id", downloadId)
            json.field("version_external_identifier", versionExternalIdentifier)
            json.field("receipt_creation_date", receiptCreationDate)
            json.field("request_date", requestDate)
            json.field("original_purchase_date", originalPurchaseDate)
            json.field("original_application_version", originalApplicationVersion)
            json.field("expiration_date", expirationDate)
            json.key("in_app")
            entries.write(to: &json)
        }
    }
}

extension PendingRenewalInfo {
    /// Writes the element as verifyReceipt does.
    public func write(to json: inout JSONBuffer) {
        json.object { json in
            json.field("auto_renew_product_id", autoRenewProductId)
            json.field("auto_renew_status", autoRenewStatus)
            json.field("product_id", productId)
            json.field("original_transaction_id", originalTransactionId)
            json.field("expiration_intent", expirationIntent)
            json.field("is_in_billing_retry_period", isInBillingRetryPeriod)
            json.field("grace_period_expires_date", gracePeriodExpiresDate)
            json.field("price_consent_status", priceConsentStatus)
        }
    }
}

extension VerifyReceiptResponse {
    /// The response body, keys in Apple's order.
    public func jsonBytes() -> [UInt8] {
        var json = JSONBuffer(capacity: 512 + (receipt?.entries.count ?? 0) * 700 + (latestReceiptInfo?.count ?? 0) * 800 + (latestReceipt?.utf8.count ?? 0))
        json.object { json in
            json.field("status", Int64(status))
            json.field("environment", environment?.rawValue)
            if let receipt {
                json.key("receipt")
                receipt.write(to: &json)
            }
            if let latestReceiptInfo {
                json.key("latest_receipt_info")
                json.array(latestReceiptInfo) { json, entry in entry.write(to: &json) }
            }
            json.field("latest_receipt", latestReceipt)
            if let pendingRenewalInfo {
                json.key("pending_renewal_info")
                json.array(pendingRenewalInfo) { json, entry in entry.write(to: &json) }
            }
            if let isRetryable { json.field("is_retryable", isRetryable) }
            json.field("exception", exception)
        }
        return json.bytes
    }
}

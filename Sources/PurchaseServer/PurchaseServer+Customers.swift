import AppStoreCrypto
import AppStoreModels
import Foundation
import Storage

/// One thing that happened to a customer.
public struct TimelineItem: Codable, Sendable, Equatable {
    /// When (Unix ms).
    public var at: Int64
    /// `purchase`, `refund`, `verification`, `notification`, `webhook`, `audit`.
    public var kind: String
    public var id: String
    public var detail: [String: String]

    /// Newest first; ties in a fixed order, so pages never overlap or skip.
    static func precedes(_ lhs: TimelineItem, _ rhs: TimelineItem) -> Bool {
        (lhs.at, rhs.kind, rhs.id) > (rhs.at, lhs.kind, lhs.id)
    }
}

/// A page of a customer's timeline.
public struct TimelinePage: Codable, Sendable, Equatable {
    public var items: [TimelineItem]
    /// Pass as `cursor` for the next page; nil at the end.
    public var next: String?
}

/// A customer found by a search.
public struct CustomerMatch: Codable, Sendable, Equatable {
    public var appUserId: String
    /// `appUserId` (a prefix), `transactionId`, `originalTransactionId` or `orderId` (through Look Up Order ID).
    public var matchedBy: String
}

extension PurchaseServer {
    /// Finds customers by an app user id prefix, a transaction id, an original transaction id, or the order id
    /// on the customer's Apple email receipt (asked of the App Store Server API when the app has a key).
    public func customers(appId: String, query: String) async throws -> [CustomerMatch] {
        let query = query.trimmingCharacters(in: .whitespaces)
        guard (1...256).contains(query.utf8.count), !query.unicodeScalars.contains(where: { $0.properties.generalCategory == .control }) else {
            throw ServerError(.invalidQuery, "query is 1–256 characters without control characters.")
        }
        guard let app = try await store.app(appId) else { throw ServerError(.appNotFound, "App \(appId) is not registered.") }
        let codePointOrder = try await store.userIdsSortByCodePoint()
        var matches = try await store.database.read { db -> [CustomerMatch] in
            let customers = CustomerRepository(db: db, appId: appId)
            var found: [CustomerMatch] = []
            func add(_ users: [String], _ how: String) {
                for user in users where !found.contains(where: { $0.appUserId == user }) { found.append(CustomerMatch(appUserId: user, matchedBy: how)) }
            }
            if query.allSatisfy(\.isNumber) {
                add(try customers.users(transactionId: query), "transactionId")
                add(try customers.users(originalTransactionId: query), "originalTransactionId")
            }
            add(try customers.users(prefix: query, limit: 20, codePointOrder: codePointOrder), "appUserId")
            return found
        }
        // An Apple order id (letters and digits, on the customer's email receipt): only Apple knows its transactions.
        if matches.isEmpty, query.count <= 32, query.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber) }), query.contains(where: \.isLetter),
           let credentials = app.serverAPIKey, let client = serverAPIClient, let key = try? PrivateKey(pem: credentials.privateKey) {
            for environment in [AppStoreEnvironment.production, .sandbox] {
                guard let response = try? await serverAPICall(app: app, credentials: credentials, key: key, client: client, method: "GET",
                                                              path: "inApps/v1/lookup/\(query)", environment: environment),
                      response.status == 200, let body = try? JSONValue.parse(response.body) else { continue }
                for signed in (body["signedTransactions"]?.array ?? []).compactMap(\.text) {
                    guard let (transaction, _) = try? engine.transactionInspector.inspect(signed, bundleIds: app.bundleIds) else { continue }
                    let users = try await store.database.read { db in
                        try CustomerRepository(db: db, appId: appId).users(originalTransactionId: transaction.originalTransactionId)
                    }
                    for user in users where !matches.contains(where: { $0.appUserId == user }) {
                        matches.append(CustomerMatch(appUserId: user, matchedBy: "orderId"))
                    }
                }
            }
        }
        return matches
    }

    /// A customer's timeline, newest first: purchases and refunds, verifications, notifications, webhook events
    /// and audit events. `cursor` continues from a previous page.
    public func timeline(appId: String, appUserId: String, limit: Int, cursor: String?) async throws -> TimelinePage {
        let limit = max(1, min(limit, 500))
        var before = Int64.max
        var skip = 0
        if let cursor {
            let parts = cursor.split(separator: ".")
            guard parts.count == 2, let at = Int64(parts[0]), let count = Int(parts[1]), count >= 0, count <= 10_000 else {
                throw ServerError(.invalidCursor, "cursor is the `next` of a previous page.")
            }
            before = at
            skip = count
        }
        let fetch = limit + skip
        let until = before
        var items = try await store.database.read { db -> [TimelineItem] in
            let before = until
            let customers = CustomerRepository(db: db, appId: appId)
            var items: [TimelineItem] = []
            for transaction in try UserRepository(db: db, appId: appId).transactions(appUserId) {
                let detail = ["productId": transaction.productId, "productType": transaction.productType, "environment": transaction.environment,
                              "originalTransactionId": transaction.originalTransactionId]
                if transaction.purchaseDate <= before {
                    items.append(TimelineItem(at: transaction.purchaseDate, kind: "purchase", id: transaction.transactionId, detail: detail))
                }
                if let refunded = transaction.cancellationDate, refunded <= before {
                    items.append(TimelineItem(at: refunded, kind: "refund", id: transaction.transactionId, detail: detail))
                }
            }
            items += try customers.jobs(appUserId, before: before, limit: fetch)
            items += try customers.notifications(appUserId, before: before, limit: fetch)
            items += try customers.webhookEvents(appUserId, before: before, limit: fetch)
            items += try customers.audit(appUserId, before: before, limit: fetch)
            return items
        }
        items.sort(by: TimelineItem.precedes)
        // Items at the cursor's time already shown are dropped (the cursor counts them).
        if skip > 0 {
            var dropped = 0
            items.removeAll { item in
                guard item.at == before, dropped < skip else { return false }
                dropped += 1
                return true
            }
        }
        let page = Array(items.prefix(limit))
        var next: String?
        if items.count > limit, let last = page.last {
            let sameTime = page.filter { $0.at == last.at }.count + (last.at == before ? skip : 0)
            next = "\(last.at).\(sameTime)"
        }
        return TimelinePage(items: page, next: next)
    }
}

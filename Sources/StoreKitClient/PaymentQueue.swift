import Foundation

/// What StoreKit 1 tells the app (SKPaymentTransactionObserver). Every method has a default that does nothing.
public protocol PaymentTransactionObserver: AnyObject, Sendable {
    /// Transactions changed: purchasing, purchased, failed, restored, deferred.
    func paymentQueue(_ queue: PaymentQueue, updated transactions: [PaymentTransaction]) async
    /// Finished transactions left the queue.
    func paymentQueue(_ queue: PaymentQueue, removed transactions: [PaymentTransaction]) async
    func paymentQueueRestoreCompletedTransactionsFinished(_ queue: PaymentQueue) async
    func paymentQueue(_ queue: PaymentQueue, restoreCompletedTransactionsFailedWith error: StoreKitError) async
}

extension PaymentTransactionObserver {
    public func paymentQueue(_ queue: PaymentQueue, updated transactions: [PaymentTransaction]) async {}
    public func paymentQueue(_ queue: PaymentQueue, removed transactions: [PaymentTransaction]) async {}
    public func paymentQueueRestoreCompletedTransactionsFinished(_ queue: PaymentQueue) async {}
    public func paymentQueue(_ queue: PaymentQueue, restoreCompletedTransactionsFailedWith error: StoreKitError) async {}
}

/// SKPaymentQueue with Swift names: add payments, observe transactions, finish them, restore.
/// Transactions not finished stay in the queue and are delivered again at the next launch (`start()`),
/// and an observer added late still receives everything waiting.
public actor PaymentQueue {
    public let connection: AppStoreConnection
    private var observers: [any PaymentTransactionObserver] = []
    /// The queue: unfinished transactions by id.
    public private(set) var transactions: [String: PaymentTransaction] = [:]

    public init(connection: AppStoreConnection) {
        self.connection = connection
    }

    /// `SKPaymentQueue.canMakePayments()`: false when purchases are restricted on the device.
    public func canMakePayments() async throws -> Bool {
        try await connection.device().canMakePayments
    }

    /// At launch: loads every unfinished transaction from the App Store and tells the observers.
    public func start() async throws {
        let waiting = try await connection.unfinishedTransactions()
        for transaction in waiting { transactions[transaction.transactionIdentifier] = transaction }
        if !waiting.isEmpty { await notify(waiting) }
    }

    /// Adds an observer; it receives the transactions already waiting, as StoreKit delivers them to late observers.
    public func add(_ observer: any PaymentTransactionObserver) async {
        observers.append(observer)
        let waiting = transactions.values.sorted { $0.transactionDate < $1.transactionDate }
        if !waiting.isEmpty { await observer.paymentQueue(self, updated: waiting) }
    }

    public func remove(_ observer: any PaymentTransactionObserver) {
        observers.removeAll { $0 === observer }
    }

    /// Adds a payment: observers see it `purchasing`, then purchased, failed or deferred.
    public func add(_ payment: Payment) async {
        let placeholder = PaymentTransaction(transactionIdentifier: "pending-" + UUID().uuidString, originalTransactionIdentifier: nil,
                                             productIdentifier: payment.productIdentifier, quantity: payment.quantity, transactionState: .purchasing,
                                             transactionDate: Int64(Date().timeIntervalSince1970 * 1000), expiresDate: nil,
                                             applicationUsername: payment.applicationUsername, error: nil, transactionReceipt: nil, signedTransaction: nil)
        await notify([placeholder])
        var result: PaymentTransaction
        do {
            result = try await connection.add(payment)
        } catch let error as StoreKitError {
            result = placeholder
            result.transactionState = .failed
            result.error = error
        } catch {
            result = placeholder
            result.transactionState = .failed
            result.error = StoreKitError.network("\(error)")
        }
        if result.transactionState != .failed || !result.transactionIdentifier.hasPrefix("pending-") {
            transactions[result.transactionIdentifier] = result
        }
        await notify([result])
    }

    /// `finishTransaction(_:)`: tells the App Store and removes the transaction from the queue.
    public func finish(_ transaction: PaymentTransaction) async throws {
        if !transaction.transactionIdentifier.hasPrefix("pending-") { try await connection.finish(transaction.transactionIdentifier) }
        transactions[transaction.transactionIdentifier] = nil
        for observer in observers { await observer.paymentQueue(self, removed: [transaction]) }
    }

    /// `restoreCompletedTransactions()`: restored transactions, then finished (or failed) for every observer.
    public func restoreCompletedTransactions() async {
        do {
            let restored = try await connection.restore()
            for transaction in restored { transactions[transaction.transactionIdentifier] = transaction }
            if !restored.isEmpty { await notify(restored) }
            for observer in observers { await observer.paymentQueueRestoreCompletedTransactionsFinished(self) }
        } catch {
            let failure = error as? StoreKitError ?? StoreKitError.network("\(error)")
            for observer in observers { await observer.paymentQueue(self, restoreCompletedTransactionsFailedWith: failure) }
        }
    }

    private func notify(_ changed: [PaymentTransaction]) async {
        for observer in observers { await observer.paymentQueue(self, updated: changed) }
    }
}

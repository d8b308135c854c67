import Foundation
import Storage

/// What the settlements of one batch read before they are planned (the job's lease, the ledger rows of their
/// transactions, the owners of their chains), fetched with one statement of each kind for the whole batch rather
/// than three per settlement. A settlement that names a job, transaction or chain an earlier one in the batch
/// wrote reads its own again, after those writes: each is planned exactly as if it were settled alone, in order.
/// On PostgreSQL the rows read stay locked until the batch commits, so another batch (of this process or another)
/// cannot change what a plan was made from: each chain is locked before its owners are read (`ChainLocks`: a chain
/// nobody owns yet has no row to lock), and a ledger row new to both is guarded by the insert's conflict, which makes
/// the settlement retry.
struct SettlementReads {
    /// Job id → the owner of its lease, for jobs being verified.
    private var leases: [String: String] = [:]
    /// Environment and transaction id → ledger row (absent: none).
    private var entries: [Key: LedgerEntry] = [:]
    /// App, environment and original transaction id → owners, in the order they were granted.
    private var owners: [Key: [String]] = [:]
    /// What settlements applied so far may have changed.
    private var written: Set<Key> = []

    private enum Key: Hashable {
        case job(String)
        case transaction(environment: String, id: String)
        case chain(appId: String, environment: String, id: String)
    }

    /// What a settlement's plan is made from.
    struct Snapshot {
        var holdsLease: Bool
        var entries: [String: LedgerEntry]
        var owners: [String: [String]]
    }

    /// Reads what `batch` needs in one statement per kind (per environment and app for the ledger).
    static func load(_ batch: [Settlement], jobs: JobRepository, db: any SQLConnection, audit: AuditRepository) throws -> SettlementReads {
        var reads = SettlementReads()
        if jobs.dialect == .postgres {
            try ChainLocks(db: db).lock(Set(batch.flatMap { settlement in
                settlement.transactions.map {
                    ChainLocks.Chain(appId: settlement.job.appId, environment: settlement.environment.rawValue, originalTransactionId: $0.originalTransactionId)
                }
            }))
        }
        reads.leases = try jobs.leases(batch.map(\.job.id))
        for (environment, settlements) in Dictionary(grouping: batch, by: { $0.environment.rawValue }) {
            let ledger = LedgerRepository(db: db, appId: "", environment: environment, audit: audit)
            for (id, entry) in try ledger.entries(settlements.flatMap { $0.transactions.map(\.transactionId) }, lock: jobs.dialect == .postgres) {
                reads.entries[.transaction(environment: environment, id: id)] = entry
            }
            for (appId, ofApp) in Dictionary(grouping: settlements, by: \.job.appId) {
                let ledger = LedgerRepository(db: db, appId: appId, environment: environment, audit: audit)
                for (id, list) in try ledger.owners(ofApp.flatMap { $0.transactions.map(\.originalTransactionId) }, lock: jobs.dialect == .postgres) {
                    reads.owners[.chain(appId: appId, environment: environment, id: id)] = list
                }
            }
        }
        return reads
    }

    /// The lease, rows and owners for `settlement`'s transactions of products the app sells (`known`): from the
    /// batch's reads, or read again when an earlier settlement of the batch wrote any of them.
    mutating func snapshot(for settlement: Settlement, known: [ConfirmedTransaction], jobs: JobRepository, ledger: LedgerRepository) throws -> Snapshot {
        let environment = settlement.environment.rawValue, appId = settlement.job.appId
        let keys = Self.keys(of: settlement)
        defer { written.formUnion(keys) }
        guard written.isDisjoint(with: keys) else {
            return Snapshot(holdsLease: try jobs.holdsLease(settlement.job.id, owner: settlement.owner),
                            entries: try ledger.entries(known.map(\.transactionId), lock: jobs.dialect == .postgres),
                            owners: try ledger.owners(known.map(\.originalTransactionId), lock: jobs.dialect == .postgres))
        }
        var snapshot = Snapshot(holdsLease: leases[settlement.job.id] == settlement.owner, entries: [:], owners: [:])
        for transaction in known {
            snapshot.entries[transaction.transactionId] = entries[.transaction(environment: environment, id: transaction.transactionId)]
            snapshot.owners[transaction.originalTransactionId] = owners[.chain(appId: appId, environment: environment, id: transaction.originalTransactionId)]
        }
        return snapshot
    }

    /// Everything a settlement may write: its job, its transactions' rows, its chains' owners.
    private static func keys(of settlement: Settlement) -> Set<Key> {
        let environment = settlement.environment.rawValue
        var keys: Set<Key> = [.job(settlement.job.id)]
        for transaction in settlement.transactions {
            keys.insert(.transaction(environment: environment, id: transaction.transactionId))
            keys.insert(.chain(appId: settlement.job.appId, environment: environment, id: transaction.originalTransactionId))
        }
        return keys
    }
}

import AppStoreModels
import Foundation
import StorekeeperTesting
import Synchronization
import Testing
@testable import PurchaseServer

/// Which new jobs wake the workers of other processes sharing the database (PostgreSQL `NOTIFY` at commit).
@Suite("Waking other processes' workers")
struct WorkerWakeupTests {
    @Test("New jobs are left to this process's worker while it runs with room; other processes are woken when it is full or stopped, never for rejected uploads")
    func wakesOthersOnlyWhenNeeded() async throws {
        // A receipt the emulator signed, checked here and then sent to an Apple that answers only when told.
        let world = try await ServerWorld.make(.sqlite, startWorker: false)
        let (_, receipt) = try await world.buy("com.example.coins", "Nada.JPYF01")
        await world.stop()
        let transport = GatedTransport()
        var configuration = PurchaseServer.Configuration(
            trust: TrustStore(certificates: [TestSupport.authority.root, TestSupport.authority.intermediate]),
            endpoints: .emulator(URL(string: "http://emulator")!), transport: transport, adminKey: "sk_admin_test_key_0000",
            worker: .init(concurrency: 1, batchSize: 1, lease: 30, pollInterval: .milliseconds(20)),
            retry: .init(baseDelay: 60, maxDelay: 60, maxAge: 3600))
        configuration.webhooks = .init(pollInterval: .milliseconds(50))
        let server = try await PurchaseServer.open(database: try await Engine.sqlite.makeDatabase(), configuration: configuration)
        let store = server.store
        defer { Task { await store.database.close() } }
        try await store.createApp(ServerApp(id: "com.example.coins", sharedSecret: try await world.emulator.app("com.example.coins").sharedSecret), now: Date())
        func job(_ user: String) -> VerificationJob {
            store.newJob(appId: "com.example.coins", appUserId: user, kind: .purchase, receiptData: "MIIT\(user)", now: Date())
        }
        var rejected = job("rejected")
        rejected.state = .rejected
        func eventually(_ condition: () -> Bool) async throws {
            for _ in 0..<200 where !condition() { try await Task.sleep(for: .milliseconds(10)) }
        }

        // No worker running here: others must take the jobs.
        #expect(store.wakesOtherProcesses(for: [job("alice")]))
        let worker = server.runWorker()
        try await eventually { !store.wakesOtherProcesses(for: [job("alice")]) }
        #expect(!store.wakesOtherProcesses(for: [job("alice")]), "a running worker with room takes its own jobs")
        #expect(!store.wakesOtherProcesses(for: [rejected]))

        // The worker's one place taken by a job waiting on Apple: new jobs need the others.
        _ = try await server.submit(appId: "com.example.coins", appUserId: "bob", receiptData: receipt, kind: .purchase)
        try await eventually { server.worker.inFlight == 1 }
        #expect(server.worker.inFlight == 1, "the job was settled or rejected before reaching Apple")
        #expect(store.wakesOtherProcesses(for: [job("carol")]), "a full worker leaves new jobs to the others")
        #expect(!store.wakesOtherProcesses(for: [rejected]))

        // Apple answers (a failure, retried in a minute): the place is free, new jobs are this worker's again.
        transport.open()
        try await eventually { !store.wakesOtherProcesses(for: [job("carol")]) }
        #expect(server.worker.inFlight == 0)
        #expect(!store.wakesOtherProcesses(for: [job("carol")]))

        worker.cancel()
        await worker.value
        #expect(store.wakesOtherProcesses(for: [job("dave")]), "a stopped worker takes nothing")
    }
}

/// A transport whose calls wait until `open()`, then fail as if Apple could not be reached.
final class GatedTransport: HTTPTransport {
    private let isOpen = Atomic<Bool>(false)

    func open() { isOpen.store(true, ordering: .relaxed) }

    func post(_ url: URL, body: [UInt8], timeout: TimeInterval) async throws -> (status: Int, contentType: String?, body: Data) {
        while !isOpen.load(ordering: .relaxed) { try await Task.sleep(for: .milliseconds(10)) }
        throw URLError(.cannotConnectToHost)
    }
}

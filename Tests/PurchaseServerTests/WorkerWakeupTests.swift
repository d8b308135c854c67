import AppStoreModels
import Foundation
import Storage
import StorekeeperTesting
import Synchronization
import Testing
@testable import PurchaseServer

/// Which new jobs wake the workers of other processes sharing the database (PostgreSQL `NOTIFY` at commit).
@Suite("Waking other processes' workers")
struct WorkerWakeupTests {
    @Test("New jobs are left to this process's worker while it runs with room; other processes are woken when it is full or stopped, never for rejected uploads")
    func wakesOthersOnlyWhenNeeded() async throws {
        let (server, transport, receipt) = try await GatedTransport.serverWithOnePlace()
        let store = server.store
        defer { Task { await store.database.close() } }
        func job(_ user: String) -> VerificationJob {
            store.newJob(appId: "com.example.coins", appUserId: user, kind: .purchase, receiptData: "MIIT\(user)", now: Date())
        }
        var rejected = job("rejected")
        rejected.state = .rejected

        // No worker running here: others must take the jobs.
        #expect(store.wakesOtherProcesses(for: [job("alice")]))
        let worker = server.runWorker()
        try await TestSupport.eventually { !store.wakesOtherProcesses(for: [job("alice")]) }
        #expect(!store.wakesOtherProcesses(for: [job("alice")]), "a running worker with room takes its own jobs")
        #expect(!store.wakesOtherProcesses(for: [rejected]))

        // The worker's one place taken by a job waiting on Apple: new jobs need the others.
        _ = try await server.submit(appId: "com.example.coins", appUserId: "bob", receiptData: receipt, kind: .purchase)
        try await TestSupport.eventually { server.worker.inFlight == 1 }
        #expect(server.worker.inFlight == 1, "the job was settled or rejected before reaching Apple")
        #expect(store.wakesOtherProcesses(for: [job("carol")]), "a full worker leaves new jobs to the others")
        #expect(!store.wakesOtherProcesses(for: [rejected]))

        // Apple answers (a failure, retried in a minute): the place is free, new jobs are this worker's again.
        transport.open()
        try await TestSupport.eventually { !store.wakesOtherProcesses(for: [job("carol")]) }
        #expect(server.worker.inFlight == 0)
        #expect(!store.wakesOtherProcesses(for: [job("carol")]))

        worker.cancel()
        await worker.value
        #expect(store.wakesOtherProcesses(for: [job("dave")]), "a stopped worker takes nothing")
    }
}

/// Uploads to a process whose worker has a free place skip the queue's claim.
@Suite("Uploads handed to this process's worker")
struct UploadHandOffTests {
    @Test("An upload takes a free place of the running worker at once and is written claimed by it; without a place it is written pending; a failed write gives the place back")
    func uploadsTakeFreePlaces() async throws {
        let (server, transport, receipt) = try await GatedTransport.serverWithOnePlace()
        let store = server.store
        defer { Task { await store.database.close() } }
        func row(_ id: String) async throws -> SQLRow? {
            try await store.database.read { db in
                try db.query("SELECT state, attempts, open_claims, lease_owner, lease_expires_at FROM verification_jobs WHERE id = ?", [id]).first
            }
        }
        func submit(_ user: String) async throws -> VerificationJob {
            try await server.submit(appId: "com.example.coins", appUserId: user, receiptData: receipt, kind: .purchase)
        }

        /// Lets Apple fail the calls until these jobs are back in the queue for a retry and no place is taken.
        func fail(_ ids: [String]) async throws {
            func done() async throws -> Bool {
                for id in ids where try await row(id).map({ $0.string("state") != "pending" || $0.int("attempts") == 0 }) ?? true { return false }
                return server.worker.inFlight == 0
            }
            transport.open()
            try await TestSupport.eventually { try await done() }
            transport.close()
        }

        // No worker running: the upload waits in the queue for a claim.
        let alice = try await submit("alice")
        #expect(alice.state == .pending && alice.attempts == 0)
        #expect(try await row(alice.id)?.string("lease_owner") == nil)
        let worker = server.runWorker()
        defer { worker.cancel() }
        try await TestSupport.eventually { server.worker.inFlight != 0 }
        #expect(server.worker.inFlight == 1, "the running worker claimed the queued job")

        // The worker's one place is taken: the upload is written pending, for a claim.
        let bob = try await submit("bob")
        #expect(bob.state == .pending && bob.attempts == 0)
        #expect(try await row(bob.id)?.string("lease_owner") == nil)
        // Apple fails both calls (each retried in a minute): the place is free again.
        try await fail([alice.id, bob.id])
        #expect(try await row(bob.id)?.string("state") == "pending")
        #expect(server.worker.inFlight == 0)

        // Once a claim has found the queue empty, uploads are handed over.
        try await TestSupport.eventually { server.worker.places.takesUploads }
        // A free place: the upload is written claimed by the worker, its first attempt counted as a claim counts it,
        // and holds the place as soon as the upload is answered, with no claim in between.
        let start = Date()
        let carol = try await submit("carol")
        #expect(server.worker.inFlight == 1)
        #expect(carol.state == .verifying && carol.attempts == 1)
        let stored = try #require(try await row(carol.id))
        #expect(stored.string("state") == "verifying")
        #expect(stored.int("attempts") == 1 && stored.int("open_claims") == 1)
        #expect(stored.string("lease_owner") == server.worker.owner)
        let leaseEnds = Date(milliseconds: stored.int("lease_expires_at") ?? 0)
        #expect(leaseEnds >= start.addingTimeInterval(29) && leaseEnds <= Date().addingTimeInterval(31))
        // Its outcome is written under that lease: Apple fails the call, and the job is put back for a retry.
        try await fail([carol.id])
        let retried = try #require(try await row(carol.id))
        #expect(retried.string("state") == "pending" && retried.string("lease_owner") == nil && retried.int("open_claims") == 0)

        // A write that fails gives its place back.
        try await store.database.transaction { db in try db.run("DROP TABLE verification_receipts", []) }
        await #expect(throws: (any Error).self) { try await submit("dave") }
        #expect(server.worker.inFlight == 0, "the failed upload's place was given back")
        let hasRoom = store.localWorkerHasRoom.load(ordering: .relaxed)
        #expect(hasRoom)
    }
}

/// A worker whose concurrency follows what its process's descriptors allow now (`follow(capacity:)`).
@Suite("A worker following its process's free descriptors")
struct WorkerCapacityTests {
    @Test("Calls in flight stay within what the source allows now, never past the configured concurrency; more are taken as it allows more")
    func inFlightFollowsTheSource() async throws {
        let (server, transport, receipt) = try await GatedTransport.serverWithOnePlace(places: 4)
        let store = server.store
        defer { Task { await store.database.close() } }
        let allowed = Atomic<Int>(2)
        server.worker.follow { allowed.load(ordering: .relaxed) }
        #expect(server.worker.capacity == 2)
        let worker = server.runWorker()
        defer { worker.cancel() }
        /// Waits for `count` calls in flight, then sees that they stay `count` however often the worker looks.
        func holds(_ count: Int) async throws {
            try await TestSupport.eventually { server.worker.inFlight == count }
            for _ in 0..<5 {
                server.worker.wake()
                try await Task.sleep(for: .milliseconds(40))
            }
            #expect(server.worker.inFlight == count)
        }
        for user in ["alice", "bob", "carol", "dave", "erin", "frank"] {
            _ = try await server.submit(appId: "com.example.coins", appUserId: user, receiptData: receipt, kind: .purchase)
        }
        // Apple holds every call: two are in flight and the others wait in the queue, however often the worker looks.
        try await holds(2)

        // The source allows more than the configured concurrency: the worker takes up to that, and no more.
        allowed.store(100, ordering: .relaxed)
        #expect(server.worker.capacity == 4)
        try await holds(4)

        // It allows fewer than are in flight: none is cut short, and no place is free until enough of them end.
        allowed.store(1, ordering: .relaxed)
        server.worker.wake()
        try await TestSupport.eventually { server.worker.places.capacity == 1 }
        #expect(server.worker.inFlight == 4 && !server.worker.places.hasRoom)
        transport.open()
        try await TestSupport.eventually { server.worker.inFlight == 0 }
    }
}

/// The worker's places as a value: when an upload is handed over and when it is queued behind others.
@Suite("A worker's places")
struct WorkerPlacesTests {
    @Test("Uploads are handed over only while the worker runs with a free place and no job may be waiting in the queue; a claim holds its places")
    func handOverRules() async {
        var places = WorkerPlaces(capacity: 2)
        func reserve() -> Bool { places.reserve() }
        func free() -> Bool { places.free() }
        func claim(batch: Int = 8, found: (WorkerPlaces.Claim) -> Int?, started: Int, turningAway uploads: Int = 0) {
            guard let claim = places.beginClaim(batch: batch) else { Issue.record("no place for a claim"); return }
            for _ in 0..<uploads { #expect(!reserve()) }
            places.endClaim(claim, found: found(claim), started: started)
        }
        #expect(!reserve(), "a stopped worker takes no upload")
        places.running = true
        #expect(!reserve(), "jobs written before it started may be waiting")
        // A claim that finds as many due jobs as it asked for may have left more.
        claim(found: { $0.asked }, started: 2)
        #expect(places.inFlight == 2 && !places.takesUploads)
        #expect(places.beginClaim(batch: 8) == nil, "no place for a claim")
        #expect(free(), "it was full")
        claim(found: { _ in 0 }, started: 0)
        #expect(places.inFlight == 1 && places.takesUploads, "a claim found fewer than it asked for: the queue was empty")
        #expect(reserve())
        #expect(places.inFlight == 2)
        // Full: the upload is queued, and the ones after it wait behind it even when a place frees up.
        #expect(!reserve())
        #expect(free())
        #expect(places.hasRoom && !reserve(), "an upload was queued: later ones do not pass it")
        // A claim holds the places it may fill: an upload meanwhile is turned away, and the claim cannot tell
        // whether it saw that upload's job.
        claim(found: { _ in 0 }, started: 0, turningAway: 1)
        #expect(places.inFlight == 1 && places.claiming == 0 && !places.takesUploads)
        // A failed claim, or one whose only job was poison (found, not started), may have left more.
        claim(found: { _ in nil }, started: 0)
        claim(found: { $0.asked }, started: 0)
        #expect(places.inFlight == 1 && !places.takesUploads)
        claim(found: { _ in 0 }, started: 0)
        #expect(places.takesUploads && reserve())
        #expect(places.inFlight == 2 && places.beginClaim(batch: 8) == nil)
        places.running = false
        #expect(!places.takesNewJobs && !reserve())
    }
}

extension GatedTransport {
    /// A server on SQLite whose worker has one place and whose calls to Apple go through a new gated transport
    /// (a failure is retried a minute later), with the coins app; and a receipt the emulator signed, which passes the
    /// server's own checks and is then sent to that Apple.
    static func serverWithOnePlace(places: Int = 1) async throws -> (server: PurchaseServer, transport: GatedTransport, receipt: String) {
        let world = try await ServerWorld.make(.sqlite, startWorker: false)
        let (_, receipt) = try await world.buy("com.example.coins", "Nada.JPYF01")
        let sharedSecret = try await world.emulator.app("com.example.coins").sharedSecret
        await world.stop()
        let transport = GatedTransport()
        var configuration = PurchaseServer.Configuration(
            trust: TrustStore(certificates: [TestSupport.authority.root, TestSupport.authority.intermediate]),
            endpoints: .emulator(URL(string: "http://emulator")!), transport: transport, adminKey: "sk_admin_test_key_0000",
            worker: .init(concurrency: places, batchSize: 1, lease: 30, pollInterval: .milliseconds(20)),
            retry: .init(baseDelay: 60, maxDelay: 60, maxAge: 3600))
        configuration.webhooks = .init(pollInterval: .milliseconds(50))
        let server = try await PurchaseServer.open(database: try await Engine.sqlite.makeDatabase(), configuration: configuration)
        try await server.store.createApp(ServerApp(id: "com.example.coins", sharedSecret: sharedSecret), now: Date())
        return (server, transport, receipt)
    }
}

/// A transport whose calls wait until `open()`, then fail as if Apple could not be reached.
final class GatedTransport: HTTPTransport {
    private let isOpen = Atomic<Bool>(false)

    func open() { isOpen.store(true, ordering: .relaxed) }

    func close() { isOpen.store(false, ordering: .relaxed) }

    func post(_ url: URL, body: [UInt8], timeout: TimeInterval) async throws -> (status: Int, contentType: String?, body: Data) {
        while !isOpen.load(ordering: .relaxed) { try await Task.sleep(for: .milliseconds(10)) }
        throw URLError(.cannotConnectToHost)
    }
}

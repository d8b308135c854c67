import Foundation
import FuzzTargets
import StorekeeperTesting
import Testing

/// Every input kept under Tests/fuzz/TARGET (seeds written by hand, and each crash `make fuzz` ever
/// found, minimised) and the real fixtures, replayed through the harnesses: a trap fails the run.
@Suite("Fuzz corpus replay")
struct CorpusReplayTests {
    static let root = TestSupport.repositoryRoot().appendingPathComponent("Tests/fuzz")

    static func files(_ target: String) -> [URL] {
        let directory = root.appendingPathComponent(target)
        let names = (try? FileManager.default.contentsOfDirectory(atPath: directory.path)) ?? []
        return names.sorted().map { directory.appendingPathComponent($0) }
    }

    /// Runs `body` on a Dispatch thread: the request harness blocks its thread while the server answers
    /// on the cooperative pool, which must never be blocked by a test.
    static func offPool(_ body: @escaping @Sendable () -> Void) async {
        await withCheckedContinuation { continuation in
            DispatchQueue.global().async {
                body()
                continuation.resume()
            }
        }
    }

    @Test("Each harness has kept inputs, and survives them", arguments: FuzzTargets.all.keys.sorted())
    func replay(target: String) async throws {
        let inputs = Self.files(target)
        #expect(!inputs.isEmpty, "Tests/fuzz/\(target) holds no inputs")
        let harness = try #require(FuzzTargets.all[target])
        for file in inputs {
            let bytes = Array(try Data(contentsOf: file))
            await Self.offPool { harness(bytes) }
        }
    }

    @Test("The real receipts and JWS survive their harnesses")
    func fixtures() async throws {
        let real = TestSupport.sharedDirectory.appendingPathComponent("fixtures/real")
        let names = try FileManager.default.contentsOfDirectory(atPath: real.path)
        var replayed = 0
        let harnesses = [".receipt.b64": "receipt", ".jws": "jws", ".json": "json"]
        for name in names {
            guard let target = harnesses.first(where: { name.hasSuffix($0.key) })?.value else { continue }
            let bytes = Array(try Data(contentsOf: real.appendingPathComponent(name)))
            if let harness = FuzzTargets.all[target] { await Self.offPool { harness(bytes) } }
            replayed += 1
        }
        #expect(replayed >= 8)
    }
}

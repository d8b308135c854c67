import AppStoreEmulator
import AppStoreModels
import Foundation
import StorekeeperTesting
import Testing

@Suite("Example stores built into the binary")
struct ExampleCatalogsTests {
    @Test("The built-in copies are the files in examples/ (run scripts/embed-examples.sh after changing one), and each loads")
    func sameAsTheFiles() throws {
        let examples = TestSupport.repositoryRoot().appendingPathComponent("examples")
        let names = try FileManager.default.contentsOfDirectory(atPath: examples.path).filter { $0.hasSuffix(".storekit") }.sorted()
        #expect(names == ExampleCatalogs.files.keys.sorted())
        for name in names {
            let file = try String(contentsOf: examples.appendingPathComponent(name), encoding: .utf8)
            #expect(ExampleCatalogs.files[name] == file.trimmingCharacters(in: .newlines), "\(name) differs: run scripts/embed-examples.sh")
            #expect(try !StoreKitConfiguration(data: Data(ExampleCatalogs.files[name]!.utf8)).products.isEmpty)
        }
    }
}

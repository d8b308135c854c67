import Foundation
import SQLiteStorage
import Storage
import Testing

@Suite("Document stores")
struct DocumentStoreTests {
    static func temporaryPath() -> String {
        FileManager.default.temporaryDirectory.appendingPathComponent("storekeeper-\(UUID().uuidString).sqlite").path
    }

    static func stores() throws -> [any DocumentStore] {
        [InMemoryDocumentStore(), try SQLiteDocumentStore(path: temporaryPath())]
    }

    @Test("Put, replace, delete and list behave the same in both engines", arguments: [0, 1])
    func basics(engine: Int) async throws {
        let store = try Self.stores()[engine]
        try await store.apply([.put(collection: "apps", id: "b", body: Data("2".utf8)), .put(collection: "apps", id: "a", body: Data("1".utf8))])
        try await store.apply([.put(collection: "apps", id: "a", body: Data("1b".utf8)), .put(collection: "other", id: "x", body: Data())])
        #expect(try await store.documents(in: "apps").map(\.id) == ["a", "b"])
        #expect(try await store.document(in: "apps", id: "a") == Data("1b".utf8))
        try await store.apply([.delete(collection: "apps", id: "a"), .delete(collection: "apps", id: "missing")])
        #expect(try await store.documents(in: "apps").map(\.id) == ["b"])
        #expect(try await store.document(in: "apps", id: "a") == nil)
    }

    @Test("SQLite documents survive reopening the file")
    func durability() async throws {
        let path = Self.temporaryPath()
        do {
            let store = try SQLiteDocumentStore(path: path)
            try await store.apply([.put(collection: "transactions", id: "2000000000000001", body: Data(#"{"ok":true}"#.utf8))])
        }
        let reopened = try SQLiteDocumentStore(path: path)
        #expect(try await reopened.document(in: "transactions", id: "2000000000000001") == Data(#"{"ok":true}"#.utf8))
    }

    @Test("Concurrent batches all land")
    func concurrentWrites() async throws {
        let store = try SQLiteDocumentStore(path: Self.temporaryPath())
        try await withThrowingTaskGroup(of: Void.self) { group in
            for index in 0..<200 {
                group.addTask { try await store.apply([.put(collection: "c", id: String(format: "%03d", index), body: Data([UInt8(index % 256)]))]) }
            }
            try await group.waitForAll()
        }
        #expect(try await store.documents(in: "c").count == 200)
    }

    @Test("A directory that cannot hold the file gives a storage error")
    func unopenable() {
        #expect(throws: StorageError.self) { _ = try SQLiteDocumentStore(path: "/nonexistent-dir/x/y.sqlite") }
    }
}

import Foundation
import Locking
import Synchronization

/// One change to a document store.
public enum DocumentWrite: Sendable, Equatable {
    /// Inserts or replaces a document.
    case put(collection: String, id: String, body: Data)
    /// Removes a document (no error if absent).
    case delete(collection: String, id: String)
}

/// A stored document.
public struct StoredDocument: Sendable, Equatable {
    public let id: String
    public let body: Data
    public init(id: String, body: Data) {
        self.id = id
        self.body = body
    }
}

/// A failure of the storage engine, with a stable code.
public struct StorageError: Error, Sendable, CustomStringConvertible {
    public let code: String
    public let message: String
    public init(code: String, message: String) {
        self.code = code
        self.message = message
    }
    public var description: String { "\(code): \(message)" }
}

/// Durable JSON documents grouped in collections: what the emulator keeps across restarts.
///
/// Writes are applied atomically in batches and in call order; `apply` returns once they are durable.
public protocol DocumentStore: Sendable {
    /// Applies the writes in one transaction.
    func apply(_ writes: [DocumentWrite]) async throws
    /// Every document of a collection.
    func documents(in collection: String) async throws -> [StoredDocument]
    /// One document, or nil.
    func document(in collection: String, id: String) async throws -> Data?
}

/// A store in memory, for tests and `--data :memory:`.
public final class InMemoryDocumentStore: DocumentStore {
    private let collections = Locked<[String: [String: Data]]>([:])

    /// Creates an empty store.
    public init() {}

    public func apply(_ writes: [DocumentWrite]) async throws {
        collections.withLock { collections in
            for write in writes {
                switch write {
                case .put(let collection, let id, let body): collections[collection, default: [:]][id] = body
                case .delete(let collection, let id): collections[collection]?[id] = nil
                }
            }
        }
    }

    public func documents(in collection: String) async throws -> [StoredDocument] {
        collections.withLock { ($0[collection] ?? [:]).map { StoredDocument(id: $0.key, body: $0.value) }.sorted { $0.id < $1.id } }
    }

    public func document(in collection: String, id: String) async throws -> Data? {
        collections.withLock { $0[collection]?[id] }
    }
}

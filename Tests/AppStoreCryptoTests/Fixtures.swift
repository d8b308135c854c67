import Foundation

/// Reads the shared fixtures that sit beside the checkout (`../shared/fixtures`).
enum Fixtures {
    static let root: URL = {
        var url = URL(fileURLWithPath: #filePath)
        for _ in 0..<4 { url.deleteLastPathComponent() }
        return url.appendingPathComponent("shared")
    }()

    static func data(_ folder: String, prefix: String, suffix: String) throws -> Data {
        let directory = root.appendingPathComponent(folder)
        let names = try FileManager.default.contentsOfDirectory(atPath: directory.path).sorted()
        guard let name = names.first(where: { $0.hasPrefix(prefix) && $0.hasSuffix(suffix) }) else { throw CocoaError(.fileNoSuchFile) }
        return try Data(contentsOf: directory.appendingPathComponent(name))
    }

    static func text(_ folder: String, prefix: String, suffix: String) throws -> String {
        String(decoding: try data(folder, prefix: prefix, suffix: suffix), as: UTF8.self)
    }
}

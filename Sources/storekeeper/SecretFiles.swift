import AppStoreCrypto
import Foundation
import Glibc

/// Files that hold secrets (the admin key, the master key, app keys): created 0600 with O_EXCL, so
/// they are never readable by others even for an instant, and never chmod-ed afterwards.
enum SecretFiles {
    /// The process creates everything private: directories 0700, files 0600 (SQLite databases
    /// and their journals included). Called first thing in `main`.
    static func restrictCreatedFiles() { umask(0o077) }

    /// Reads `file`, or creates it with `make()` if it does not exist; returns the text and whether it was created now.
    static func readOrCreate(_ file: URL, make: () -> String) throws -> (text: String, created: Bool) {
        if let text = try? String(contentsOf: file, encoding: .utf8), !text.isEmpty {
            return (text.trimmingCharacters(in: .whitespacesAndNewlines), false)
        }
        let text = make()
        let descriptor = open(file.path, O_WRONLY | O_CREAT | O_EXCL, 0o600)
        guard descriptor >= 0 else {
            // Another process created it between the read and the open: use theirs.
            if errno == EEXIST, let text = try? String(contentsOf: file, encoding: .utf8), !text.isEmpty {
                return (text.trimmingCharacters(in: .whitespacesAndNewlines), false)
            }
            throw CommandFailure(description: "cannot create \(file.path): \(String(cString: strerror(errno)))")
        }
        defer { close(descriptor) }
        let bytes = Array((text + "\n").utf8)
        guard write(descriptor, bytes, bytes.count) == bytes.count else { throw CommandFailure(description: "cannot write \(file.path)") }
        return (text, true)
    }

    /// Writes `data` to `file` as a new 0600 file that replaces the old one (written aside, then renamed).
    static func replace(_ file: URL, with data: Data) throws {
        let temporary = file.path + ".new-\(getpid())"
        unlink(temporary)
        let descriptor = open(temporary, O_WRONLY | O_CREAT | O_EXCL, 0o600)
        guard descriptor >= 0 else { throw CommandFailure(description: "cannot create \(temporary)") }
        let written = data.withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
        close(descriptor)
        guard written == data.count, rename(temporary, file.path) == 0 else { throw CommandFailure(description: "cannot write \(file.path)") }
    }

    /// The master key that seals secrets in the database: `STOREKEEPER_MASTER_KEY` (64 hex digits),
    /// else `DIR/master-key`, created on first use.
    static func masterKey(in directory: URL) throws -> SecretBox {
        let hex: String
        if let given = ProcessInfo.processInfo.environment["STOREKEEPER_MASTER_KEY"], !given.isEmpty {
            hex = given
        } else {
            hex = try readOrCreate(directory.appendingPathComponent("master-key")) { SecretBox.generateKey().hexString }.text
        }
        guard let bytes = hexBytes(hex), bytes.count == SecretBox.keyLength else {
            throw CommandFailure(description: "the master key must be \(SecretBox.keyLength * 2) hex digits")
        }
        return try SecretBox(key: bytes)
    }

    static func hexBytes(_ text: String) -> [UInt8]? {
        let digits = Array(text.utf8)
        guard digits.count % 2 == 0 else { return nil }
        var bytes: [UInt8] = []
        for index in stride(from: 0, to: digits.count, by: 2) {
            guard let byte = UInt8(String(decoding: digits[index..<(index + 2)], as: UTF8.self), radix: 16) else { return nil }
            bytes.append(byte)
        }
        return bytes
    }

    /// A warning when `directory` (which holds secrets) can be read by others: it existed before and
    /// is left as it is, but the operator should know.
    static func warnIfShared(_ directory: URL) {
        guard let attributes = try? FileManager.default.attributesOfItem(atPath: directory.path),
              let mode = (attributes[.posixPermissions] as? NSNumber)?.intValue, mode & 0o077 != 0 else { return }
        warn("\(directory.path) is readable by other users (mode \(String(mode, radix: 8))); it holds keys and receipts: chmod 700 it")
    }
}

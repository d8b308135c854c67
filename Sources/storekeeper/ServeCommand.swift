import AppStoreCrypto
import AppStoreEmulator
import AppStoreModels
import CSignals
import Foundation
import HTTP
import HTTPServer
import Locking
import SQLiteStorage

/// `storekeeper appstore serve`
struct AppStoreServeCommand: Command {
    static let abstract = "Run the App Store emulator (verifyReceipt, device API, admin API)."
    static let help = """
    [--data DIR] [--host H] [--port P] [--catalog [BUNDLE_ID=]FILE]... [--tester EMAIL]... [--https-port P | --no-proxy] [--quiet]

    OPTIONS:
      --data DIR           State directory: SQLite database and signing keys (default ./.storekeeper).
      --host H             Address to bind (default 127.0.0.1).
      --port P             Port (default 8010; 0 picks a free port, printed on start).
      --catalog B=FILE     Load an Xcode .storekit file as the catalog of bundle id B (repeatable);
                           a Storekeeper JSON catalog ({"apps": [...]}) needs no bundle id.
      --tester EMAIL       Make sure a sandbox tester exists (repeatable).
      --max-body BYTES     Largest request body (default 4194304).
      --admin-token TOKEN  Require 'Authorization: Bearer TOKEN' on the admin API (default $STOREKEEPER_APPSTORE_TOKEN;
                           without one it answers loopback host names only). The CLI sends $STOREKEEPER_APPSTORE_TOKEN.
      --https-port P       Also serve TLS directly on P (443 with a hosts entry pointing Apple's names here).
      --no-proxy           Plain HTTP only: no CONNECT tunnels and no TLS for Apple's host names.
      --quiet              No access log.

    The port also answers HTTPS_PROXY clients: 'CONNECT host:443' to one of Apple's App Store hosts gets a
    tunnel whose TLS ends in the emulator (trust 'storekeeper appstore ca export --tls'); any other host is refused.
    """

    let data: String
    let host: String
    let port: UInt16
    let catalogs: [String]
    let testers: [String]
    let maxBody: Int
    let quiet: Bool
    let adminToken: String?
    let tls: EmulatorTLS.Options

    init(_ arguments: inout Arguments) throws {
        data = try arguments.option("data") ?? "./.storekeeper"
        host = try arguments.option("host") ?? "127.0.0.1"
        guard let port = UInt16(try arguments.option("port") ?? "8010") else { throw UsageError(description: "--port must be 0–65535") }
        self.port = port
        catalogs = try arguments.options("catalog")
        testers = try arguments.options("tester")
        guard let maxBody = Int(try arguments.option("max-body") ?? "4194304"), maxBody > 0 else { throw UsageError(description: "--max-body must be a positive number") }
        self.maxBody = maxBody
        quiet = arguments.flag("quiet")
        adminToken = try arguments.option("admin-token") ?? ProcessInfo.processInfo.environment["STOREKEEPER_APPSTORE_TOKEN"]
        tls = try EmulatorTLS.Options(&arguments)
    }

    func run() async throws {
        FileLimits.raise()
        let directory = URL(fileURLWithPath: data, isDirectory: true)
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let authority = try CertificateAuthority.loadOrCreate(in: directory.appendingPathComponent("ca"))
        let jwsAuthority = try CertificateAuthority.loadOrCreate(in: directory.appendingPathComponent("ca/jws"), algorithm: .ecP256)
        let store = try SQLiteDocumentStore(path: directory.appendingPathComponent("appstore.sqlite").path)
        let emulator = try await AppStoreEmulator.open(store: store, authority: authority, jwsAuthority: jwsAuthority,
                                                       xcodeAuthority: try XcodeAuthority.loadOrCreate(in: directory.appendingPathComponent("ca/xcode")))
        for entry in catalogs { try await CatalogLoader.load(entry, into: emulator) }
        for email in testers where try await !emulator.accounts().contains(where: { $0.email.lowercased() == email.lowercased() }) {
            try await emulator.addAccount(email: email, environment: .sandbox)
        }
        var configuration = HTTPServer.Configuration(host: host, port: port, maxBodySize: maxBody, connectionLimit: FileLimits.emulatorConnectionLimit(), accessLog: !quiet)
        let tlsAuthority = try tls.apply(to: &configuration, directory: directory)
        let server = HTTPServer(configuration: configuration,
                                responder: AppStoreResponder(emulator: emulator, adminToken: adminToken, tlsRoot: tlsAuthority?.root))
        let bound = try server.start()
        let notifications = Task { await emulator.runNotificationDelivery() }
        try ShutdownSignal.catch()  // from here a signal stops gracefully (one sent as soon as the address is read is kept)
        say("storekeeper appstore listening on http://\(host):\(bound)")
        if tlsAuthority != nil { say(EmulatorTLS.summary(ports: server.ports, host: host)) }
        say("data: \(directory.path)  apps: \(try await emulator.apps().map(\.bundleId).joined(separator: ", "))")
        await ShutdownSignal.wait()
        FileHandle.standardError.write(Data("shutting down\n".utf8))
        notifications.cancel()
        await server.shutdown()
    }
}

/// How the emulator serves Apple's host names over TLS (`--https-port`, `--no-proxy`).
enum EmulatorTLS {
    struct Options {
        let httpsPort: UInt16?
        let enabled: Bool

        init(_ arguments: inout Arguments) throws {
            enabled = !arguments.flag("no-proxy")
            if let text = try arguments.option("https-port") {
                guard let port = UInt16(text) else { throw UsageError(description: "--https-port must be 0–65535") }
                httpsPort = port
            } else {
                httpsPort = nil
            }
            if !enabled && httpsPort != nil { throw UsageError(description: "--https-port and --no-proxy exclude each other") }
        }

        /// Loads (or makes) the TLS root and server certificate under `directory/ca/tls` and turns interception on.
        func apply(to configuration: inout HTTPServer.Configuration, directory: URL) throws -> TLSAuthority? {
            guard enabled else { return nil }
            let authority = try TLSAuthority.loadOrCreate(in: directory.appendingPathComponent("ca/tls"))
            configuration.interception = .init(hosts: AppleHosts.all, certificateChainPEM: authority.chainPEM,
                                               privateKeyPEM: authority.serverKey.pem, extraPorts: httpsPort.map { [$0] } ?? [])
            return authority
        }
    }

    /// The line that tells how to reach the emulator as Apple's hosts.
    static func summary(ports: [UInt16], host: String) -> String {
        var line = "Apple's App Store hosts over TLS: HTTPS_PROXY=http://\(host):\(ports[0]) with the root from 'storekeeper appstore ca export --tls'"
        if ports.count > 1 { line += "; TLS directly on port \(ports[1])" }
        return line
    }
}

/// Loads `--catalog` entries.
enum CatalogLoader {
    static func load(_ entry: String, into emulator: AppStoreEmulator) async throws {
        var bundleId: String?
        var path = entry
        if let equals = entry.firstIndex(of: "="), !entry[..<equals].contains("/") {
            bundleId = String(entry[..<equals])
            path = String(entry[entry.index(after: equals)...])
        }
        // A missing example file is found built into the binary (`examples/coins.storekit` wherever it runs).
        let name = URL(fileURLWithPath: path).lastPathComponent
        guard let data = FileManager.default.contents(atPath: path) ?? ExampleCatalogs.files[name].map({ Data($0.utf8) }) else {
            throw CommandFailure(description: "cannot read catalog \(path)")
        }
        if let file = try? JSONDecoder().decode(CatalogFile.self, from: data) {
            for app in file.apps { try await emulator.register(app: app) }
            return
        }
        guard let bundleId else {
            throw CommandFailure(description: "\(path) is not a Storekeeper catalog; a .storekit file needs BUNDLE_ID=\(path)")
        }
        let configuration: StoreKitConfiguration
        do { configuration = try StoreKitConfiguration(data: data) } catch {
            throw CommandFailure(description: "\(path): \(error)")
        }
        try await emulator.register(storeKit: configuration, bundleId: bundleId)
    }
}

/// SIGINT and SIGTERM as a graceful stop for the serve commands: `catch()` just before the address is announced (a
/// client may signal as soon as it reads it), `wait()` right after. Until `catch()`, through a start that may take
/// long (a database that does not answer), a signal ends the process as it does any other command.
enum ShutdownSignal {
    /// The pipe the C handler writes each signal to (see shutdown_signals.c), made once.
    private static let signalPipe: Result<Int32, CommandFailure> = {
        let readEnd = storekeeper_catch_shutdown_signals()
        guard readEnd >= 0 else {
            return .failure(CommandFailure(description: "cannot catch SIGTERM: \(String(cString: strerror(errno)))"))
        }
        return .success(readEnd)
    }()

    /// From now on SIGINT and SIGTERM are kept for `wait()` instead of ending the process.
    static func `catch`() throws {
        _ = try signalPipe.get()
    }

    /// Waits for SIGINT or SIGTERM (one sent before this call counts). A second signal, while the stop is under way,
    /// ends the process at once (exit status 1), as an operator pressing Ctrl-C twice expects.
    static func wait() async {
        guard case .success(let readEnd) = signalPipe else { return }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            // A thread of its own, blocked in read(2): the cooperative pool is never held.
            let reader = Thread {
                /// Whether a signal's byte was read (false only if the pipe failed, which nothing here causes).
                func nextSignal() -> Bool {
                    var byte: UInt8 = 0
                    while true {
                        let count = read(readEnd, &byte, 1)
                        if count == 1 { return true }
                        if count < 0 && errno == EINTR { continue }
                        let reason = count < 0 ? String(cString: strerror(errno)) : "end of pipe"
                        signal(SIGINT, SIG_DFL)
                        signal(SIGTERM, SIG_DFL)
                        FileHandle.standardError.write(Data("cannot read signals (\(reason)): SIGINT and SIGTERM now end this process at once\n".utf8))
                        return false
                    }
                }
                guard nextSignal() else { return }
                continuation.resume()
                guard nextSignal() else { return }
                FileHandle.standardError.write(Data("second signal: stopping now\n".utf8))
                _exit(1)
            }
            reader.name = "storekeeper-signals"
            reader.start()
        }
    }
}

import Synchronization

/// `storekeeper appstore replay`
struct ReplayCommand: Command {
    static let abstract = "Serve back what a purchase server recorded from Apple (server serve --record FILE), for CI."
    static let help = """
    FILE [--data DIR] [--host H] [--port P] [--https-port P | --no-proxy] [--quiet]

    Answers verifyReceipt and the App Store Server API as recorded: the answer to the same request body when
    there is one, else the answers to the same method and path in recorded order (the last one repeating);
    404 not_recorded otherwise. Like the emulator it is Apple's hosts through HTTPS_PROXY (trust
    'storekeeper appstore ca export --tls --url ...' or DIR/ca/tls/root.pem) and /production, /sandbox on HTTP.
    Signed data in the recording verifies under the roots it was signed with (Apple's, for real sandbox traffic).
      --data DIR     Where the TLS root is kept (default ./.storekeeper).
      --port P       Port (default 8010; 0 picks a free one, printed on start).
    """
    let file: String
    let data: String
    let host: String
    let port: UInt16
    let quiet: Bool
    let tls: EmulatorTLS.Options

    init(_ arguments: inout Arguments) throws {
        data = try arguments.option("data") ?? "./.storekeeper"
        host = try arguments.option("host") ?? "127.0.0.1"
        guard let port = UInt16(try arguments.option("port") ?? "8010") else { throw UsageError(description: "--port must be 0–65535") }
        self.port = port
        quiet = arguments.flag("quiet")
        tls = try EmulatorTLS.Options(&arguments)
        file = try arguments.single("FILE (a recording)")
    }

    func run() async throws {
        FileLimits.raise()
        guard let recording = FileManager.default.contents(atPath: file) else { throw CommandFailure(description: "cannot read \(file)") }
        let replay: ReplayResponder
        do { replay = try ReplayResponder(recording: recording) } catch { throw CommandFailure(description: "\(file): \(error.description)") }
        let directory = URL(fileURLWithPath: data, isDirectory: true)
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        var configuration = HTTPServer.Configuration(host: host, port: port, connectionLimit: FileLimits.emulatorConnectionLimit(), accessLog: !quiet)
        let tlsAuthority = try tls.apply(to: &configuration, directory: directory)
        let responder = ReplayWithCA(replay: replay, tlsRoot: tlsAuthority?.root.pem)
        let server = HTTPServer(configuration: configuration, responder: responder)
        let bound = try server.start()
        try ShutdownSignal.catch()  // from here a signal stops gracefully (one sent as soon as the address is read is kept)
        say("storekeeper appstore replay listening on http://\(host):\(bound)")
        say("\(replay.count) recorded answers from \(file)")
        if tlsAuthority != nil { say(EmulatorTLS.summary(ports: server.ports, host: host)) }
        await ShutdownSignal.wait()
        await server.shutdown()
    }
}

/// The replay, plus the TLS root at `/admin/v1/ca?tls=true` so clients can be told what to trust.
struct ReplayWithCA: HTTP.Responder {
    let replay: ReplayResponder
    let tlsRoot: String?

    func respond(to request: HTTP.Request) async -> HTTP.Response {
        if request.tunnel == nil, request.method == .get, request.path == "/admin/v1/ca", request.query["tls"] == "true", let tlsRoot {
            return HTTP.Response.text(tlsRoot, contentType: "application/x-pem-file")
        }
        return await replay.respond(to: request)
    }
}

import Clocks
import AppStoreCrypto
import Foundation
import HTTP
import HTTPServer
import PostgresStorage
import PurchaseServer
import SQLiteStorage
import Storage

/// Options shared by `server serve` and `up` for building a purchase server.
struct ServerOptions {
    var data: String
    var database: String?
    var appstoreURL: String?
    var trustFiles: [String]
    var trustEmulator: Bool
    var adminKey: String?
    /// Verifications in flight at once; nil: as many as the machine allows (`FileLimits.ServerBudget`).
    var concurrency: Int?
    /// PostgreSQL connections of this process (the listening one aside).
    var databasePool: Int
    /// The client connections of this process's listener: by default the calls to Apple take the descriptors they
    /// leave. Only `serve` gives it to its listener; a caller that leaves `concurrency` nil without doing so sizes the
    /// calls as if no client were connected.
    let clientConnections = ConnectionCount()
    /// How this process shares its open-file limit (read now: after `FileLimits.raise()`).
    var fileBudget: FileLimits.ServerBudget {
        FileLimits.ServerBudget(files: FileLimits.openFileLimit(), databaseConnections: databasePool)
    }
    var callTimeout: Double
    var maxAge: Double
    var retryBase: Double
    var retryCap: Double
    var webhookRetryBase: Double
    var webhookTimeout: Double
    var lease: Double
    var reconcileInterval: Double
    var followEmulatorClock: Bool
    var uploadRate: Double
    var connectionsPerIP: UInt32
    var recordFile: String?
    var recordReceipts: Bool

    static let help = """
      --data DIR            State directory for the embedded SQLite database and the admin key (default ./.storekeeper).
      --database URL        Use PostgreSQL (postgres://user@host:port/db) instead of SQLite.
      --database-pool N     PostgreSQL connections of this process, besides one that listens (default twice its
                            cores, at least 4: more only queue in PostgreSQL for the same cores; 1…256).
      --appstore-url URL    verifyReceipt base URL (an emulator: URL/production/verifyReceipt, URL/sandbox/verifyReceipt);
                            default Apple's buy.itunes.apple.com and sandbox.itunes.apple.com.
      --trust PEM           Trust the certificates in PEM for receipts and signed transactions (repeatable;
                            default Apple's roots: Apple Inc. Root, the iTunes Store CA, Apple Root CA - G3).
      --trust-emulator      Fetch and trust the emulator's two CAs (receipts, JWS) from --appstore-url.
      --admin-key KEY       The admin API key (default $STOREKEEPER_ADMIN_KEY, else generated once into DIR/admin-key).
      --concurrency N|auto  Verifications in flight at once (default auto: as many as the machine allows, each a
                            socket to Apple and about 32 KiB: the open-file limit less the clients connected now
                            and room for 1,024 more, an eighth (at most 2,048) for webhooks, the database pool, the
                            Server API and metrics connections and a twentieth spare; at least 256, at most 65,536
                            and an eighth of memory; Apple's 3–6 s are hidden only by enough of them in flight;
                            storekeeper_verifications_in_flight_limit in /metrics shows it now).
      --call-timeout S      Seconds per verifyReceipt call (default 15).
      --max-age S           Seconds a verification keeps retrying before it is dead-lettered (default 86400).
      --retry-base S        First retry delay in seconds, doubled per attempt with jitter (default 1).
      --retry-cap S         Longest retry delay in seconds (default 300).
      --webhook-retry-base S  First delay before a failed webhook delivery is tried again, doubled per attempt with
                            jitter up to an hour, for 72 hours (default 5).
      --webhook-timeout S   Seconds a webhook endpoint has to answer (default 10).
      --lease S             Seconds a worker holds a claimed job before another process may take it over (default 120).
      --reconcile-interval S  Seconds between passes over the App Store Server API (Notification History with
                            onlyFailures, Transaction History by revision) for apps with a Server API key (default 600).
      --upload-rate N       Uploads per second per app and process, bursts of twice that (default 5000; 0 unlimited).
      --connections-per-ip N  Most connections from one address (0: unlimited; default unlimited on loopback, 64 otherwise).
      --follow-emulator-clock  Keep this server's clock on the emulator's at --appstore-url (after `appstore time advance`),
                            so both judge expiry, grace and retry alike. For development and tests only.
      --record FILE         Append every verifyReceipt and Server API answer to FILE (JSON lines, 0600) for
                            `storekeeper appstore replay`. Shared secrets and bearer tokens are never written;
                            receipts sent and returned are redacted unless --record-receipts.
      --record-receipts     Keep the receipts in the recording (it then holds customer receipts: guard it).
    """

    init(_ arguments: inout Arguments) throws {
        data = try arguments.option("data") ?? "./.storekeeper"
        database = try arguments.option("database")
        appstoreURL = try arguments.option("appstore-url")
        trustFiles = try arguments.options("trust")
        trustEmulator = arguments.flag("trust-emulator")
        adminKey = try arguments.option("admin-key") ?? ProcessInfo.processInfo.environment["STOREKEEPER_ADMIN_KEY"].flatMap { $0.isEmpty ? nil : $0 }
        // An empty or short admin key (an unset variable in a template) would be guessable: refuse to start.
        if let adminKey, adminKey.utf8.count < 16 {
            throw UsageError(description: "the admin key must be at least 16 characters (give none to have one generated)")
        }
        func number(_ name: String, _ fallback: Double) throws -> Double {
            guard let text = try arguments.option(name) else { return fallback }
            // Finite and at most a year (in seconds, or units of concurrency): every value becomes an Int or a deadline.
            guard let value = Double(text), value > 0, value <= 31_536_000 else {
                throw UsageError(description: "--\(name) must be a positive number up to 31536000")
            }
            return value
        }
        if let text = try arguments.option("database-pool") {
            guard let value = Int(text), (1...256).contains(value) else { throw UsageError(description: "--database-pool is 1…256") }
            databasePool = value
        } else {
            databasePool = max(4, 2 * ProcessInfo.processInfo.activeProcessorCount)
        }
        if let text = try arguments.option("concurrency"), text != "auto" {
            guard let value = Int(text), (1...1_000_000).contains(value) else { throw UsageError(description: "--concurrency is auto or 1…1000000") }
            concurrency = value
        }
        callTimeout = try number("call-timeout", 15)
        maxAge = try number("max-age", 86400)
        retryBase = try number("retry-base", 1)
        retryCap = try number("retry-cap", 300)
        webhookRetryBase = try number("webhook-retry-base", 5)
        webhookTimeout = try number("webhook-timeout", 10)
        lease = try number("lease", 120)
        reconcileInterval = try number("reconcile-interval", 600)
        followEmulatorClock = arguments.flag("follow-emulator-clock")
        uploadRate = try arguments.option("upload-rate").map { text in
            guard let value = Double(text), value >= 0, value <= 1_000_000 else { throw UsageError(description: "--upload-rate must be 0–1000000") }
            return value
        } ?? 5000
        recordFile = try arguments.option("record")
        recordReceipts = arguments.flag("record-receipts")
        if recordReceipts && recordFile == nil { throw UsageError(description: "--record-receipts needs --record FILE") }
        connectionsPerIP = try arguments.option("connections-per-ip").map { text in
            guard let value = UInt32(text) else { throw UsageError(description: "--connections-per-ip must be a count") }
            return value
        } ?? UInt32.max
    }

    /// Opens the database, the trust store and the server.
    /// The admin key is returned only when it was created now (to be shown once); nil when it was given or already stored.
    func openServer(emulatorCA: String? = nil, clock: (any WallClock)? = nil) async throws -> (PurchaseServer, String?, any SQLDatabase) {
        let directory = URL(fileURLWithPath: data, isDirectory: true)
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        SecretFiles.warnIfShared(directory)
        let database: any SQLDatabase
        if let url = self.database {
            database = try PostgresDatabase(url: url, size: databasePool, channels: ["storekeeper_jobs"])
        } else {
            let sqlite = try SQLiteSQLDatabase(path: directory.appendingPathComponent("server.sqlite").path)
            // Opened now, not by the first reads of a running server (each open would hold up every read).
            sqlite.openReaders()
            database = sqlite
        }
        var certificates: [Certificate] = []
        for file in trustFiles {
            guard let text = FileManager.default.contents(atPath: file) else { throw CommandFailure(description: "cannot read \(file)") }
            certificates += try Certificate.parsePEM(String(decoding: text, as: UTF8.self))
        }
        if let emulatorCA { certificates += try Certificate.parsePEM(emulatorCA) }
        if trustEmulator {
            guard let appstoreURL else { throw UsageError(description: "--trust-emulator needs --appstore-url") }
            // Both of the emulator's chains: RSA for receipts, ECC for StoreKit 2 signed data.
            for path in ["/admin/v1/ca?chain=true", "/admin/v1/ca?chain=true&jws=true"] {
                let pem = try await AdminClient(url: appstoreURL).send("GET", path)
                certificates += try Certificate.parsePEM(String(decoding: pem, as: UTF8.self))
            }
        }
        let trust = certificates.isEmpty ? try TrustStore.apple() : TrustStore(certificates: certificates)
        var endpoints = AppStoreEndpoints.apple
        if let appstoreURL {
            guard let base = URL(string: appstoreURL) else { throw UsageError(description: "--appstore-url must be a URL") }
            endpoints = .emulator(base)
        }
        let (key, created) = try adminKey.map { ($0, false) } ?? Self.persistentAdminKey(in: directory)
        let recorder = try recordFile.map { try AppleTrafficRecorder(path: $0, redactReceipts: !recordReceipts) }
        // Apple's latency is hidden by calls in flight (Little's law: 4.5 s × 2,000 receipts/s is 9,000 of them).
        // Over HTTP/1.1 each call holds a connection, so descriptors bound the calls; over HTTP/2 calls share a few
        // connections, and only memory bounds them (`follow` below).
        let budget = fileBudget
        let inFlight = concurrency ?? FileLimits.concurrency(files: .max)
        // Sized by the clients connected now: connections to Apple past what they leave are not kept idle.
        let clients = clientConnections
        var openAtMost: (@Sendable () -> Int)?
        if concurrency == nil { openAtMost = { budget.calls(clientsOpen: clients.count) } }
        let client = try ClientTransport(connectionsPerHost: concurrency ?? budget.calls, openAtMost: openAtMost)
        let transport: any HTTPTransport = recorder.map { RecordingTransport(client, recorder: $0) } ?? client
        var configuration = PurchaseServer.Configuration(
            trust: trust, endpoints: endpoints, transport: transport, adminKey: key,
            worker: .init(concurrency: inFlight, lease: max(lease, callTimeout * 2 + 1)), retry: .init(baseDelay: retryBase, maxDelay: retryCap, maxAge: maxAge),
            callTimeout: callTimeout)
        if let appstoreURL, let base = URL(string: appstoreURL) { configuration.serverAPI = .emulator(base) }
        configuration.secrets = try SecretFiles.masterKey(in: directory)
        configuration.recorder = recorder
        configuration.uploadsPerSecond = uploadRate
        configuration.webhooks = .init(concurrency: budget.webhooks, timeout: webhookTimeout, retry: .init(baseDelay: webhookRetryBase))
        let server = try await PurchaseServer.open(database: database, configuration: configuration, clock: clock ?? SystemClock())
        if concurrency == nil {
            // Calls on HTTP/1.1 connections up to what the descriptors leave beside the clients connected now; calls on
            // HTTP/2 streams besides, up to what memory allows (`inFlight`).
            server.worker.follow { budget.calls(clientsOpen: clients.count) + client.multiplexedCalls }
        }
        for app in try await server.store.apps() where app.userAuth == .optional {
            warn("app \(app.id) has userAuth optional: its public key may act for any user it names (set userAuth required once the app sends user tokens)")
        }
        return (server, created ? key : nil, database)
    }

    /// The admin key kept in the data directory (0600), created on first use.
    static func persistentAdminKey(in directory: URL) throws -> (String, Bool) {
        try SecretFiles.readOrCreate(directory.appendingPathComponent("admin-key")) { "sk_admin_" + APIKey.random() }
    }
}

/// `storekeeper server serve`
struct ServerServeCommand: Command {
    static let abstract = "Run the purchase server: receipts in, verified purchases, entitlements and balances out."
    static let help = """
    [--data DIR | --database URL] [--host H] [--port P] [--appstore-url URL] [--trust PEM]... [--trust-emulator] [--quiet]

    OPTIONS:
      --host H              Address to bind (default 127.0.0.1).
      --port P              Port (default 8020; 0 picks a free port, printed on start).
      --quiet               No access log.
      --log-format F        text (default) or json: one object per line (time, level, requestId, method, route, path,
                            status, latencyMs, bytes) on standard error.
      --metrics-port P      Also serve /metrics, /healthz and /readyz, without the admin key, on this port
                            (on the main port /metrics needs the admin key; /healthz and /readyz never do).
      --metrics-host H      Address for --metrics-port (default 127.0.0.1).
    \(ServerOptions.help)
    """

    let options: ServerOptions
    let host: String
    let port: UInt16
    let quiet: Bool
    let metricsPort: UInt16?
    let metricsHost: String
    let logFormat: HTTPServer.Configuration.LogFormat

    init(_ arguments: inout Arguments) throws {
        options = try ServerOptions(&arguments)
        metricsPort = try arguments.option("metrics-port").map { text in
            guard let port = UInt16(text) else { throw UsageError(description: "--metrics-port must be 0–65535") }
            return port
        }
        metricsHost = try arguments.option("metrics-host") ?? "127.0.0.1"
        guard let logFormat = HTTPServer.Configuration.LogFormat(rawValue: try arguments.option("log-format") ?? "text") else {
            throw UsageError(description: "--log-format is text or json")
        }
        self.logFormat = logFormat
        host = try arguments.option("host") ?? "127.0.0.1"
        guard let port = UInt16(try arguments.option("port") ?? "8020") else { throw UsageError(description: "--port must be 0–65535") }
        self.port = port
        quiet = arguments.flag("quiet")
    }

    func run() async throws {
        FileLimits.raise()
        let clock = AdjustableClock()
        var follower: Task<Void, Never>?
        if options.followEmulatorClock {
            guard let url = options.appstoreURL else { throw UsageError(description: "--follow-emulator-clock needs --appstore-url") }
            let client = try AdminClient(url: url)
            follower = Task {
                while !Task.isCancelled {
                    if let data = try? await client.send("GET", "/admin/v1/time"),
                       let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any],
                       let offset = (object["offset_seconds"] as? String).flatMap(Double.init) {
                        clock.set(offset: offset)
                    }
                    try? await Task.sleep(for: .milliseconds(200))
                }
            }
        }
        defer { follower?.cancel() }
        let (server, adminKey, database) = try await options.openServer(clock: clock)
        let worker = server.runWorker()
        let reconciler = server.runReconciler(every: .milliseconds(Int(options.reconcileInterval * 1000)))
        var httpConfiguration = HTTPServer.Configuration(host: host, port: port, maxBodySize: 4 << 20, connectionTimeout: 15,
                                                         connectionLimit: UInt32(options.fileBudget.clients),
                                                         accessLog: !quiet)
        // Unset: unlimited on loopback (local tools and benchmarks are one address), 64 on any other address.
        httpConfiguration.logFormat = logFormat
        httpConfiguration.connectionsPerIP = options.connectionsPerIP != .max ? options.connectionsPerIP : (host.hasPrefix("127.") || host == "::1" ? 0 : 64)
        httpConfiguration.openConnections = options.clientConnections
        let http = HTTPServer(configuration: httpConfiguration, responder: PurchaseServerResponder(server: server))
        let bound = try http.start()
        var monitoring: (server: HTTPServer, port: UInt16)?
        if let metricsPort {
            let operations = HTTPServer(configuration: .init(host: metricsHost, port: metricsPort, connectionLimit: FileLimits.metricsConnections, accessLog: false),
                                        responder: PurchaseServerResponder.operations(server))
            monitoring = (operations, try operations.start())
        }
        try ShutdownSignal.catch()  // from here a signal stops gracefully (one sent as soon as the address is read is kept)
        say("storekeeper server listening on http://\(host):\(bound)")
        if let monitoring { say("metrics, healthz and readyz on http://\(metricsHost):\(monitoring.port)") }
        say("database: \(options.database == nil ? "sqlite in \(options.data)" : "postgresql")")
        // Shown once, when created; afterwards it is only in DIR/admin-key (0600), never in logs.
        if let adminKey { say("admin key (created now, shown once, kept in \(options.data)/admin-key): \(adminKey)") }
        await ShutdownSignal.wait()
        FileHandle.standardError.write(Data("shutting down\n".utf8))
        // Both at once: the stop takes one server's bounds, not the sum of two.
        let monitoringServer = monitoring?.server
        async let mainStopped: Void = http.shutdown()
        async let monitoringStopped: Void? = monitoringServer?.shutdown()
        _ = await (mainStopped, monitoringStopped)
        reconciler.cancel()
        worker.cancel()
        await server.worker.drain(timeout: .seconds(5))
        await database.close()
    }
}

import Glibc

/// Raises the open-file limit to its hard maximum: thousands of verifications in flight need sockets.
enum FileLimits {
    /// What a process allowed to (root, or CAP_SYS_RESOURCE) raises its hard limit to, the kernel permitting.
    static let wanted: rlim_t = 1 << 18

    static func raise() {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return }
        if limit.rlim_max < wanted {
            var higher = rlimit(rlim_cur: wanted, rlim_max: wanted)
            if setrlimit(Int32(RLIMIT_NOFILE.rawValue), &higher) == 0 { return }
        }
        limit.rlim_cur = limit.rlim_max
        _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
    }

    /// The share of the open-file limit the emulator's listener may hold: it opens few files besides its clients,
    /// and a purchase server's calls to it are thousands of connections when Apple's latency is emulated.
    static let emulatorClientShare = 0.9
    /// Descriptors the emulator's TLS tunnels hold besides the listener's connections: each the client's socket and
    /// the front's end of a socket pair (the other end is one of the listener's connections).
    static let emulatorTunnelDescriptors = 2 * HTTPServer.tunnelLimit

    /// The emulator listener's connection limit: nine tenths of the open-file limit less what its tunnels may hold,
    /// at most 65,536. No floor of 1,024 as for the server's clients: at 1,024 files it would leave the tunnels no
    /// room (at 1,024 files the limit is 409; below about 640 it is 64, and the tunnels may then run out of files).
    static func emulatorConnectionLimit(files: Int = openFileLimit()) -> UInt32 {
        UInt32(min(65_536, max(64, Int(Double(files) * emulatorClientShare) - emulatorTunnelDescriptors)))
    }
    /// Connections the purchase server's `--metrics-port` listener accepts (Prometheus needs one or two).
    static let metricsConnections: UInt32 = 64

    /// How a purchase server shares its open-file limit: a descriptor per client connection, per call to Apple in
    /// flight and per webhook delivery, and a spare for the rest. Clients and calls share what webhooks and the spare
    /// leave: calls take what the clients connected now do not hold, less room for `clientHeadroom` more of them. As
    /// clients connect, no new call starts past what they leave, and connections to Apple past it are closed once
    /// answered (idle ones within 50 ms); calls in flight are not cut short, so a burst of more than `clientHeadroom`
    /// new clients within one call's time (3–6 s, at most the call timeout) may find no descriptor until calls end.
    struct ServerBudget: Equatable {
        /// Connections clients can always open beyond those they hold (up to `clients`): a burst of new clients finds
        /// room at once, and the calls in flight make way for more as they end (calls take no new place meanwhile).
        static let clientHeadroom = 1024

        let files: Int
        /// The listener's connection limit: a quarter of the limit, between 1,024 and 65,536.
        let clients: Int
        /// Webhook deliveries in flight: an eighth of the limit, between 64 and 2,048.
        let webhooks: Int
        /// The database's connections and its listening one, the Server API's two hosts (16 each), the metrics
        /// listener, and a twentieth of the limit (at least 256) for files, logs and event loops.
        let spare: Int
        /// Calls to Apple in flight at most (`calls(clientsOpen: 0)`): what is left beside room for `clientHeadroom`
        /// clients, at least 256, at most 65,536 and an eighth of memory at 32 KiB.
        let calls: Int

        init(files: Int, databaseConnections: Int) {
            self.files = files
            clients = Int(FileLimits.connectionLimit(share: 0.25, of: files))
            webhooks = min(2048, max(64, files / 8))
            spare = databaseConnections + 1 + 32 + Int(FileLimits.metricsConnections) + max(256, files / 20)
            calls = FileLimits.concurrency(files: files - min(clients, Self.clientHeadroom) - webhooks - spare)
        }

        /// Calls to Apple in flight while clients hold `clientsOpen` connections: what is left beside them and room
        /// for `clientHeadroom` more (up to `clients`). With every client connected, what a fixed quarter left before.
        func calls(clientsOpen: Int) -> Int {
            let held = min(clients, max(0, clientsOpen) + Self.clientHeadroom)
            return min(calls, max(256, files - held - webhooks - spare))
        }
    }

    /// Verifications in flight for `files` open files: one each, at most an eighth of the memory this process may use
    /// at 32 KiB each, at most 65,536 and at least 256.
    static func concurrency(files: Int) -> Int {
        // 32 KiB a call: measured 33 KiB per verification in flight (`bench/steady.sh`).
        let memory = Int(min(ProcessInfo.processInfo.physicalMemory, containerMemoryLimit() ?? .max) / 8 / 32_768)
        return max(256, min(65_536, files, memory))
    }

    /// This process's open-file limit (its soft limit, which `raise` lifts to the hard one), or 1,024 when unknown.
    static func openFileLimit() -> Int {
        var limit = rlimit()
        return getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 ? Int(min(limit.rlim_cur, 1 << 30)) : 1024
    }

    /// The cgroup's memory limit (v2 `memory.max`, v1 `memory.limit_in_bytes`), when one is set: inside a container
    /// the machine's memory is not what the process may use.
    static func containerMemoryLimit() -> UInt64? {
        for path in ["/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"] {
            guard let text = try? String(contentsOfFile: path, encoding: .utf8),
                  let bytes = UInt64(text.trimmingCharacters(in: .whitespacesAndNewlines)), bytes < 1 << 60 else { continue }
            return bytes
        }
        return nil
    }

    /// Connections a listener may accept: `share` of the open-file limit, between 1,024 and 65,536
    /// (the emulator must take every call a server with tens of thousands in flight makes at once).
    static func connectionLimit(share: Double, of files: Int = openFileLimit()) -> UInt32 {
        UInt32(min(65_536, max(1024, Double(files) * share)))
    }
}

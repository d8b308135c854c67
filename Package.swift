// swift-tools-version:6.0
import PackageDescription

/// One settings list for every Swift target: Swift 6 language mode with strict concurrency.
let swiftSettings: [SwiftSetting] = [
    .swiftLanguageMode(.v6),
    .enableUpcomingFeature("ExistentialAny"),
]

let package = Package(
    name: "Storekeeper",
    platforms: [.macOS(.v14)],
    products: [
        .executable(name: "storekeeper", targets: ["storekeeper"]),
        .library(name: "AppStoreEmulator", targets: ["AppStoreEmulator"]),
        .library(name: "PurchaseServer", targets: ["PurchaseServer"]),
        .library(name: "StoreKitClient", targets: ["StoreKitClient"]),
    ],
    targets: [
        .systemLibrary(name: "CMicroHTTPD", pkgConfig: "libmicrohttpd", providers: [.apt(["libmicrohttpd-dev"])]),
        .systemLibrary(name: "COpenSSL", pkgConfig: "openssl", providers: [.apt(["libssl-dev"])]),
        .systemLibrary(name: "CSQLite", pkgConfig: "sqlite3", providers: [.apt(["libsqlite3-dev"])]),
        .systemLibrary(name: "CSystem"),
        .systemLibrary(name: "CLibPQ", pkgConfig: "libpq", providers: [.apt(["libpq-dev"])]),
        // HTTP/2 framing, HPACK and flow control for the emulator's server and the purchase server's calls to Apple.
        .systemLibrary(name: "CNGHTTP2", pkgConfig: "libnghttp2", providers: [.apt(["libnghttp2-dev"])]),
        // jemalloc as the storekeeper program's allocator (see its main.swift).
        .systemLibrary(name: "CJemalloc", pkgConfig: "jemalloc", providers: [.apt(["libjemalloc-dev"])]),
        // OpenSSL initialised before main without its atexit cleanup (see no_atexit.c).
        .target(name: "COpenSSLSetup", linkerSettings: [.linkedLibrary("crypto")]),
        // SIGINT and SIGTERM caught into a pipe for the serve commands' graceful stop (see shutdown_signals.c).
        .target(name: "CSignals"),

        .target(name: "Locking", swiftSettings: swiftSettings),
        .target(name: "Clocks", dependencies: [.target(name: "CSystem", condition: .when(platforms: [.linux])), "Locking"], swiftSettings: swiftSettings),
        .target(name: "AppStoreModels", swiftSettings: swiftSettings),
        .target(name: "HTTP", swiftSettings: swiftSettings),
        .target(name: "HTTP2Wire", dependencies: ["CNGHTTP2"], swiftSettings: swiftSettings),
        .target(name: "HTTPServer", dependencies: ["HTTP", "Clocks", "CMicroHTTPD", "CNGHTTP2", "HTTP2Wire", "COpenSSL", "COpenSSLSetup", "CSystem", "Locking"], swiftSettings: swiftSettings),
        .target(name: "HTTPClient", dependencies: ["Clocks", "CNGHTTP2", "HTTP2Wire", "COpenSSL", "COpenSSLSetup", "CSystem", "Locking"], swiftSettings: swiftSettings),
        .target(name: "AppStoreCrypto", dependencies: ["AppStoreModels", "COpenSSL", "COpenSSLSetup", "Locking"], swiftSettings: swiftSettings),
        .target(name: "Storage", dependencies: ["Locking"], swiftSettings: swiftSettings),
        .target(name: "SQLiteStorage", dependencies: ["Storage", "CSQLite"], swiftSettings: swiftSettings),
        .target(name: "PostgresStorage", dependencies: ["Storage", "CLibPQ", "COpenSSLSetup", "Locking"], swiftSettings: swiftSettings),
        .target(
            name: "AppStoreEmulator",
            dependencies: ["AppStoreModels", "AppStoreCrypto", "HTTP", "HTTPClient", "Storage", "Locking", "Clocks"],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "PurchaseServer",
            dependencies: ["AppStoreModels", "AppStoreCrypto", "HTTP", "HTTPClient", "Storage", "Locking", "Clocks"],
            swiftSettings: swiftSettings
        ),
        .target(name: "StoreKitClient", dependencies: ["AppStoreModels", "AppStoreCrypto", "Storage", "SQLiteStorage", "Clocks"], swiftSettings: swiftSettings),
        .target(
            name: "StorekeeperTesting",
            dependencies: ["AppStoreEmulator", "HTTP", "Storage", "SQLiteStorage", "Clocks"],
            swiftSettings: swiftSettings
        ),
        // Harnesses for every parser an attacker reaches; `storekeeper-fuzz` runs them under libFuzzer (make fuzz).
        .target(name: "FuzzTargets", dependencies: ["AppStoreCrypto", "AppStoreModels", "HTTP", "HTTPClient", "PurchaseServer", "SQLiteStorage", "Locking"],
                swiftSettings: swiftSettings),
        .executableTarget(name: "storekeeper-fuzz", dependencies: ["FuzzTargets"], swiftSettings: swiftSettings),
        // Benchmark tools (make bench): an open-loop load generator and a bare libmicrohttpd handler to compare with.
        .executableTarget(name: "storekeeper-bench", dependencies: ["CMicroHTTPD"], swiftSettings: swiftSettings),
        .executableTarget(
            name: "storekeeper",
            dependencies: ["AppStoreEmulator", "AppStoreCrypto", "AppStoreModels", "HTTP", "HTTPServer", "HTTPClient", "SQLiteStorage", "PostgresStorage", "PurchaseServer", "StoreKitClient", "Locking", "Clocks", "CSignals", "CJemalloc"],
            swiftSettings: swiftSettings
        ),

        .testTarget(name: "FuzzTargetsTests", dependencies: ["FuzzTargets", "StorekeeperTesting"], swiftSettings: swiftSettings),
        .testTarget(name: "AppStoreModelsTests", dependencies: ["AppStoreModels"], swiftSettings: swiftSettings),
        .testTarget(
            name: "AppStoreCryptoTests",
            dependencies: ["AppStoreCrypto", "AppStoreModels"],
            swiftSettings: swiftSettings
        ),
        .testTarget(name: "HTTPTests", dependencies: ["HTTP", "HTTPServer", "HTTPClient", "Locking", "Clocks"], swiftSettings: swiftSettings),
        .testTarget(name: "SQLiteStorageTests", dependencies: ["Storage", "SQLiteStorage"], swiftSettings: swiftSettings),
        .testTarget(
            name: "PurchaseServerTests",
            dependencies: ["PurchaseServer", "AppStoreEmulator", "AppStoreCrypto", "AppStoreModels", "HTTP", "HTTPServer", "Storage", "SQLiteStorage",
                           "PostgresStorage", "StorekeeperTesting", "Locking", "Clocks"],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "StoreKitClientTests",
            dependencies: ["StoreKitClient", "AppStoreEmulator", "AppStoreModels", "PurchaseServer", "HTTPServer", "SQLiteStorage", "StorekeeperTesting", "Locking", "Clocks"],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "AppStoreEmulatorTests",
            dependencies: ["AppStoreEmulator", "AppStoreCrypto", "AppStoreModels", "HTTP", "StorekeeperTesting", "Clocks"],
            swiftSettings: swiftSettings
        ),
    ]
)

// jemalloc as the program's allocator: linked ahead of the C library, its `malloc` and `free` serve the whole process, the
// Swift runtime and the C libraries included. With Apple taking seconds, the purchase server holds tens of thousands of
// verifications in flight and the emulator as many held calls, their buffers of every size freed out of order over a heap
// of hundreds of megabytes; glibc's allocator then spent 12% of the server's samples sorting and merging free chunks
// (`_int_malloc`, `unlink_chunk`, `malloc_consolidate`) at 3,500 receipts/s with 3–6 s, against 6% instantly
// (bench/README, forty-second round). Nothing of it is called; the import links it.
import CJemalloc
import Foundation

/// The command tree of `storekeeper`.
let tree = CommandNode.group(abstract: "Storekeeper: in-app purchases done right — a local App Store, a purchase server, a StoreKit client.", children: [
    ("appstore", .group(abstract: "The App Store emulator and the commands that drive it.", children: [
        ("serve", .command(AppStoreServeCommand.self)),
        ("replay", .command(ReplayCommand.self)),
        ("tester", .group(abstract: "Manage sandbox testers.", children: [
            ("add", .command(TesterAddCommand.self)), ("family", .command(TesterFamilyCommand.self)),
        ])),
        ("buy", .command(BuyCommand.self)),
        ("finish", .command(FinishCommand.self)),
        ("refund", .command(RefundCommand.self)),
        ("subscription", .command(SubscriptionControlCommand.self)),
        ("grace-period", .command(GracePeriodCommand.self)),
        ("redeem-code", .command(RedeemCodeCommand.self)),
        ("win-back", .command(WinBackCommand.self)),
        ("restore", .command(RestoreCommand.self)),
        ("simulate-error", .command(SimulateErrorCommand.self)),
        ("test-session", .command(TestSessionCommand.self)),
        ("resolve", .command(ResolveCommand.self)),
        ("delete-transactions", .command(DeleteTransactionsCommand.self)),
        ("time", .group(abstract: "Control the emulator clock.", children: [
            ("advance", .command(TimeAdvanceCommand.self)), ("set", .command(TimeSetCommand.self)), ("show", .command(TimeShowCommand.self)),
        ])),
        ("fault", .group(abstract: "Inject faults.", children: [
            ("add", .command(FaultAddCommand.self)), ("clear", .command(FaultClearCommand.self)), ("list", .command(FaultListCommand.self)),
        ])),
        ("ca", .group(abstract: "The emulator's certificate authorities.", children: [("export", .command(CAExportCommand.self)), ("revoke", .command(CARevokeCommand.self))])),
        ("catalog", .group(abstract: "The emulator's catalogs.", children: [("export", .command(CatalogExportCommand.self))])),
        ("key", .group(abstract: "App Store Server API keys.", children: [("create", .command(ServerAPIKeyCreateCommand.self))])),
        ("notifications", .group(abstract: "App Store Server Notifications V2.", children: [("set", .command(NotificationURLCommand.self))])),
    ])),
    ("server", .group(abstract: "The purchase server and the commands that administer it.", children: [
        ("serve", .command(ServerServeCommand.self)),
        ("app", .group(abstract: "Manage apps.", children: [("add", .command(ServerAppAddCommand.self))])),
        ("key", .group(abstract: "Manage API keys: public (pk_, in the app) and secret (sk_, on your backend).", children: [
            ("create", .command(ServerKeyCreateCommand.self)), ("list", .command(ServerKeyListCommand.self)),
            ("revoke", .command(ServerKeyRevokeCommand.self)), ("rotate", .command(ServerKeyRotateCommand.self)),
        ])),
        ("product", .group(abstract: "Manage what products grant.", children: [("set", .command(ServerProductSetCommand.self))])),
        ("user", .group(abstract: "Inspect users.", children: [("show", .command(ServerUserShowCommand.self))])),
        ("jobs", .group(abstract: "Inspect and replay verification jobs.", children: [
            ("list", .command(ServerJobsListCommand.self)), ("replay", .command(ServerJobsReplayCommand.self)),
            ("recount", .command(ServerJobsRecountCommand.self)),
        ])),
        ("webhook", .group(abstract: "Webhook endpoints: what your backend hears when what a user owns changes.", children: [
            ("add", .command(ServerWebhookAddCommand.self)), ("list", .command(ServerWebhookListCommand.self)),
            ("remove", .command(ServerWebhookRemoveCommand.self)), ("test", .command(ServerWebhookTestCommand.self)),
            ("deliveries", .command(ServerWebhookDeliveriesCommand.self)), ("redeliver", .command(ServerWebhookRedeliverCommand.self)),
            ("rotate", .command(ServerWebhookRotateCommand.self)),
        ])),
        ("operator", .group(abstract: "Console operators: who may sign in to /console, and with which role.", children: [
            ("add", .command(ServerOperatorAddCommand.self)), ("list", .command(ServerOperatorListCommand.self)),
            ("remove", .command(ServerOperatorRemoveCommand.self)),
        ])),
        ("report", .command(ServerReportCommand.self)),
        ("backup", .command(ServerBackupCommand.self)),
        ("metrics", .command(ServerMetricsCommand.self)),
        ("reconcile", .command(ServerReconcileCommand.self)),
    ])),
    ("webhook", .group(abstract: "Webhooks while developing.", children: [("listen", .command(WebhookListenCommand.self))])),
    ("up", .command(UpCommand.self)),
    ("shop", .command(ShopCommand.self)),
    ("shop-bench", .command(ShopBenchCommand.self)),
    ("receipt", .group(abstract: "Work with App Store receipts.", children: [
        ("decode", .command(ReceiptDecodeCommand.self)),
    ])),
    ("jws", .group(abstract: "Work with StoreKit 2 signed data (JWS).", children: [
        ("decode", .command(JWSDecodeCommand.self)),
        ("bench", .command(JWSBenchCommand.self)),
    ])),
])

SecretFiles.restrictCreatedFiles()
let status = await tree.dispatch(path: ["storekeeper"], words: Array(CommandLine.arguments.dropFirst()))
exit(status)

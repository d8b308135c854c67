import Storage

/// The purchase server's schema: the same statements on SQLite and PostgreSQL (times are Unix
/// milliseconds in BIGINT, booleans 0/1, ids text), applied at start.
enum Schema {
    static let migrations: [SQLMigration] = [
        SQLMigration(version: 1, statements: [
            """
            CREATE TABLE apps (
                id TEXT PRIMARY KEY,
                name TEXT NOT NULL,
                shared_secret TEXT,
                bundle_ids TEXT NOT NULL,
                replay_policy TEXT NOT NULL,
                sandbox_policy TEXT NOT NULL,
                sandbox_allow_list TEXT NOT NULL,
                quirk_21002_policy TEXT NOT NULL,
                created_at BIGINT NOT NULL
            )
            """,
            "CREATE TABLE api_keys (key_hash TEXT PRIMARY KEY, app_id TEXT NOT NULL, label TEXT, created_at BIGINT NOT NULL, revoked_at BIGINT)",
            """
            CREATE TABLE products (
                app_id TEXT NOT NULL, product_id TEXT NOT NULL, type TEXT NOT NULL,
                entitlement TEXT, currency TEXT, amount BIGINT, duration_days BIGINT,
                price TEXT, price_currency TEXT,
                PRIMARY KEY (app_id, product_id)
            )
            """,
            """
            CREATE TABLE users (
                app_id TEXT NOT NULL, app_user_id TEXT NOT NULL, flagged BIGINT NOT NULL, flag_reason TEXT, created_at BIGINT NOT NULL,
                PRIMARY KEY (app_id, app_user_id)
            )
            """,
            """
            CREATE TABLE verification_jobs (
                id TEXT PRIMARY KEY, app_id TEXT NOT NULL, app_user_id TEXT NOT NULL, kind TEXT NOT NULL,
                receipt_data TEXT NOT NULL, state TEXT NOT NULL, reason TEXT, environment TEXT,
                attempts BIGINT NOT NULL, next_attempt_at BIGINT NOT NULL, lease_owner TEXT, lease_expires_at BIGINT,
                created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL, settled_at BIGINT, result TEXT
            )
            """,
            "CREATE INDEX verification_jobs_due ON verification_jobs (state, next_attempt_at)",
            "CREATE INDEX verification_jobs_user ON verification_jobs (app_id, app_user_id)",
            """
            CREATE TABLE ledger (
                environment TEXT NOT NULL, transaction_id TEXT NOT NULL,
                app_id TEXT NOT NULL, app_user_id TEXT NOT NULL, product_id TEXT NOT NULL, product_type TEXT NOT NULL,
                quantity BIGINT NOT NULL, purchase_date BIGINT NOT NULL, original_purchase_date BIGINT,
                original_transaction_id TEXT NOT NULL, web_order_line_item_id TEXT, expires_date BIGINT,
                price TEXT, currency TEXT, source TEXT NOT NULL, verification_id TEXT NOT NULL,
                cancellation_date BIGINT, cancellation_reason TEXT, is_trial BIGINT NOT NULL,
                credited_currency TEXT, credited_amount BIGINT, clawed_back_at BIGINT, recorded_at BIGINT NOT NULL,
                PRIMARY KEY (environment, transaction_id)
            )
            """,
            "CREATE INDEX ledger_user ON ledger (app_id, app_user_id)",
            "CREATE INDEX ledger_original ON ledger (app_id, environment, original_transaction_id)",
            "CREATE INDEX ledger_purchase_date ON ledger (app_id, purchase_date)",
            """
            CREATE TABLE ownership (
                app_id TEXT NOT NULL, environment TEXT NOT NULL, original_transaction_id TEXT NOT NULL, app_user_id TEXT NOT NULL,
                product_id TEXT NOT NULL, granted_at BIGINT NOT NULL,
                PRIMARY KEY (app_id, environment, original_transaction_id, app_user_id)
            )
            """,
            "CREATE INDEX ownership_user ON ownership (app_id, app_user_id)",
            """
            CREATE TABLE balances (
                app_id TEXT NOT NULL, app_user_id TEXT NOT NULL, currency TEXT NOT NULL, amount BIGINT NOT NULL,
                PRIMARY KEY (app_id, app_user_id, currency)
            )
            """,
            """
            CREATE TABLE spends (
                app_id TEXT NOT NULL, app_user_id TEXT NOT NULL, idempotency_key TEXT NOT NULL, currency TEXT NOT NULL,
                amount BIGINT NOT NULL, balance_after BIGINT NOT NULL, created_at BIGINT NOT NULL,
                PRIMARY KEY (app_id, app_user_id, idempotency_key)
            )
            """,
            """
            CREATE TABLE subscriptions (
                app_id TEXT NOT NULL, environment TEXT NOT NULL, original_transaction_id TEXT NOT NULL, product_id TEXT NOT NULL,
                auto_renew_product_id TEXT, auto_renew_status BIGINT, expires_date BIGINT, expiration_intent TEXT,
                is_in_billing_retry BIGINT NOT NULL, grace_period_expires_date BIGINT, revoked_at BIGINT, updated_at BIGINT NOT NULL,
                PRIMARY KEY (app_id, environment, original_transaction_id)
            )
            """,
            """
            CREATE TABLE audit_events (
                id TEXT PRIMARY KEY, app_id TEXT NOT NULL, app_user_id TEXT, kind TEXT NOT NULL, detail TEXT NOT NULL, created_at BIGINT NOT NULL
            )
            """,
            "CREATE INDEX audit_events_user ON audit_events (app_id, app_user_id, created_at)",
        ]),
        // A covering index so "what does this user own" never scans the app's whole ownership table.
        SQLMigration(version: 2, statements: [
            "CREATE INDEX ownership_by_user ON ownership (app_id, app_user_id, environment, original_transaction_id)",
        ]),
        // App Store Server Notifications V2, once each (notificationUUID), kept with what became of them.
        SQLMigration(version: 3, statements: [
            """
            CREATE TABLE apple_notifications (
                notification_uuid TEXT PRIMARY KEY, app_id TEXT NOT NULL, notification_type TEXT NOT NULL, subtype TEXT,
                environment TEXT NOT NULL, signed_date BIGINT NOT NULL, received_at BIGINT NOT NULL, transaction_id TEXT,
                original_transaction_id TEXT, state TEXT NOT NULL, verification_id TEXT, signed_payload TEXT NOT NULL
            )
            """,
            "CREATE INDEX apple_notifications_by_app ON apple_notifications (app_id, received_at)",
        ]),
        // What the server needs to talk back to Apple: the app's Apple id and a Server API key.
        SQLMigration(version: 4, statements: [
            "ALTER TABLE apps ADD COLUMN app_apple_id BIGINT",
            "ALTER TABLE apps ADD COLUMN server_api_issuer_id TEXT",
            "ALTER TABLE apps ADD COLUMN server_api_key_id TEXT",
            "ALTER TABLE apps ADD COLUMN server_api_private_key TEXT",
            "ALTER TABLE apps ADD COLUMN consumption_policy TEXT",
        ]),
        // The reconciler's watermarks: Notification History's last pass, Transaction History's revision per subscription.
        SQLMigration(version: 5, statements: [
            """
            CREATE TABLE reconcile_state (
                app_id TEXT NOT NULL, environment TEXT NOT NULL, subject TEXT NOT NULL, value TEXT NOT NULL, updated_at BIGINT NOT NULL,
                PRIMARY KEY (app_id, environment, subject)
            )
            """,
        ]),
        // Claims that ended without an outcome (the process died holding the lease): three make a job poison.
        SQLMigration(version: 6, statements: [
            "ALTER TABLE verification_jobs ADD COLUMN open_claims BIGINT NOT NULL DEFAULT 0",
        ]),
        // Keys and users as Stripe and RevenueCat have them: public keys the app ships, secret keys the backend keeps,
        // user tokens signed by the developer's backend. Apps that existed keep today's behaviour (user_auth optional).
        // A job remembers whether its user was authenticated, and a rejected one keeps the receipt's hash and size, not its bytes.
        SQLMigration(version: 7, statements: [
            "ALTER TABLE api_keys ADD COLUMN kind TEXT NOT NULL DEFAULT 'secret'",
            "ALTER TABLE api_keys ADD COLUMN hint TEXT",
            "ALTER TABLE apps ADD COLUMN user_auth TEXT NOT NULL DEFAULT 'optional'",
            "ALTER TABLE apps ADD COLUMN user_token_secret TEXT",
            "ALTER TABLE apps ADD COLUMN user_token_public_key TEXT",
            "ALTER TABLE verification_jobs ADD COLUMN user_authenticated BIGINT NOT NULL DEFAULT 1",
            "ALTER TABLE verification_jobs ADD COLUMN receipt_sha256 TEXT",
            "ALTER TABLE verification_jobs ADD COLUMN receipt_size BIGINT",
        ]),
        // Server-wide values: a value sealed with the master key, so a process with another key refuses to start.
        SQLMigration(version: 8, statements: [
            "CREATE TABLE server_settings (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
        ]),
        // When a ledger row's cancellation and expiry were last known true (SettlementPlan): newer
        // information reinstates a reversed refund or moves an extended expiry; older changes nothing.
        // Existing refunds are dated by their cancellation, so a transaction signed before a refund cannot undo it.
        SQLMigration(version: 9, statements: [
            "ALTER TABLE ledger ADD COLUMN state_date BIGINT NOT NULL DEFAULT 0",
            "UPDATE ledger SET state_date = cancellation_date WHERE cancellation_date IS NOT NULL",
            // Why a validly signed notification was not acted on (state 'ignored'); it is answered 200 all the same.
            "ALTER TABLE apple_notifications ADD COLUMN reason TEXT",
            // Apple's price-increase consent (renewal info priceIncreaseStatus, verifyReceipt price_consent_status), shown with the subscription.
            "ALTER TABLE subscriptions ADD COLUMN price_increase_status BIGINT",
            // What a receipt upload says it delivers (DeliveryHint): its consumable goes to this user, others wait for theirs.
            "ALTER TABLE verification_jobs ADD COLUMN deliver_transaction_id TEXT",
            "ALTER TABLE verification_jobs ADD COLUMN deliver_product_id TEXT",
        ]),
        // Webhooks: the developer's endpoints; events written in the transaction of the change they report (an
        // outbox), numbered per user; one delivery per event and endpoint, retried with backoff; every attempt logged.
        SQLMigration(version: 10, statements: [
            """
            CREATE TABLE webhook_endpoints (id TEXT PRIMARY KEY, app_id TEXT NOT NULL, url TEXT NOT NULL, secret TEXT NOT NULL,
            previous_secret TEXT, previous_secret_until BIGINT, event_types TEXT NOT NULL DEFAULT '', created_at BIGINT NOT NULL)
            """,
            "CREATE INDEX webhook_endpoints_app ON webhook_endpoints (app_id)",
            """
            CREATE TABLE webhook_events (id TEXT PRIMARY KEY, app_id TEXT NOT NULL, app_user_id TEXT NOT NULL, type TEXT NOT NULL,
            sequence BIGINT NOT NULL, occurred_at BIGINT NOT NULL, body TEXT NOT NULL)
            """,
            "CREATE INDEX webhook_events_user ON webhook_events (app_id, app_user_id, sequence)",
            "CREATE TABLE webhook_sequences (app_id TEXT NOT NULL, app_user_id TEXT NOT NULL, sequence BIGINT NOT NULL, PRIMARY KEY (app_id, app_user_id))",
            """
            CREATE TABLE webhook_deliveries (event_id TEXT NOT NULL, endpoint_id TEXT NOT NULL, state TEXT NOT NULL, attempts BIGINT NOT NULL DEFAULT 0,
            next_attempt_at BIGINT NOT NULL, lease_owner TEXT, lease_expires_at BIGINT, last_status BIGINT, last_error TEXT,
            created_at BIGINT NOT NULL, delivered_at BIGINT, PRIMARY KEY (event_id, endpoint_id))
            """,
            "CREATE INDEX webhook_deliveries_due ON webhook_deliveries (state, next_attempt_at)",
            "CREATE INDEX webhook_deliveries_endpoint ON webhook_deliveries (endpoint_id, created_at)",
            """
            CREATE TABLE webhook_attempts (id TEXT PRIMARY KEY, event_id TEXT NOT NULL, endpoint_id TEXT NOT NULL, attempted_at BIGINT NOT NULL,
            status BIGINT, latency_ms BIGINT NOT NULL, outcome TEXT NOT NULL, response_excerpt TEXT)
            """,
            "CREATE INDEX webhook_attempts_delivery ON webhook_attempts (event_id, endpoint_id, attempted_at)",
        ]),
        // Customer tools: promotional entitlements (one live grant per user and entitlement; a revoked one keeps its row
        // for the record) and support's balance adjustments, once per idempotency key.
        SQLMigration(version: 11, statements: [
            """
            CREATE TABLE promotional_entitlements (app_id TEXT NOT NULL, app_user_id TEXT NOT NULL, entitlement TEXT NOT NULL,
            expires_date BIGINT, reason TEXT NOT NULL, granted_at BIGINT NOT NULL, revoked_at BIGINT, PRIMARY KEY (app_id, app_user_id, entitlement))
            """,
            """
            CREATE TABLE balance_adjustments (app_id TEXT NOT NULL, app_user_id TEXT NOT NULL, idempotency_key TEXT NOT NULL, currency TEXT NOT NULL,
            amount BIGINT NOT NULL, balance_after BIGINT NOT NULL, reason TEXT NOT NULL, created_at BIGINT NOT NULL,
            PRIMARY KEY (app_id, app_user_id, idempotency_key))
            """,
        ]),
        // An endpoint either receives our events, or Apple's signed notifications forwarded (for teams moving from another backend).
        SQLMigration(version: 12, statements: [
            "ALTER TABLE webhook_endpoints ADD COLUMN format TEXT NOT NULL DEFAULT 'events'",
            // An anonymous app user id merged into a logged-in one (POST /v1/users/{id}/alias), for the record.
            "CREATE TABLE user_aliases (app_id TEXT NOT NULL, alias TEXT NOT NULL, app_user_id TEXT NOT NULL, created_at BIGINT NOT NULL, PRIMARY KEY (app_id, alias))",
        ]),
        // Whether a user was ever granted a promotional entitlement: the user view reads that table only then (one query
        // less on the hottest read, for the many users who never had one).
        SQLMigration(version: 13, statements: [
            "ALTER TABLE users ADD COLUMN promotional BIGINT NOT NULL DEFAULT 0",
            "UPDATE users SET promotional = 1 WHERE EXISTS (SELECT 1 FROM promotional_entitlements p WHERE p.app_id = users.app_id AND p.app_user_id = users.app_user_id)",
        ]),
        // The subscription-metrics rollup (MetricsRepository): chains to bring up to date, each chain's stored contribution,
        // the moments (changes seen from an instant on) and the totals per day and currency. Every existing chain starts marked.
        SQLMigration(version: 14, statements: [
            "CREATE TABLE metrics_dirty (app_id TEXT NOT NULL, environment TEXT NOT NULL, original_transaction_id TEXT NOT NULL, PRIMARY KEY (app_id, environment, original_transaction_id))",
            "CREATE TABLE metrics_chains (app_id TEXT NOT NULL, environment TEXT NOT NULL, original_transaction_id TEXT NOT NULL, days TEXT NOT NULL, PRIMARY KEY (app_id, environment, original_transaction_id))",
            """
            CREATE TABLE metrics_moments (app_id TEXT NOT NULL, environment TEXT NOT NULL, original_transaction_id TEXT NOT NULL, visible_at BIGINT NOT NULL,
            day BIGINT NOT NULL, currency TEXT NOT NULL, active_subscriptions BIGINT NOT NULL, active_trials BIGINT NOT NULL, mrr_micros BIGINT NOT NULL, trials_ended BIGINT NOT NULL, churned BIGINT NOT NULL, churned_voluntary BIGINT NOT NULL, churned_billing BIGINT NOT NULL)
            """,
            "CREATE INDEX metrics_moments_chain ON metrics_moments (app_id, environment, original_transaction_id)",
            // Covering, so that today's moments are summed from the index alone (no row lookups across a big file).
            """
            CREATE INDEX metrics_moments_day ON metrics_moments (app_id, day, visible_at, environment, currency, active_subscriptions, active_trials,
            mrr_micros, trials_ended, churned, churned_voluntary, churned_billing)
            """,
            """
            CREATE TABLE metrics_days (app_id TEXT NOT NULL, environment TEXT NOT NULL, day BIGINT NOT NULL, currency TEXT NOT NULL, new_subscriptions BIGINT NOT NULL, trials_started BIGINT NOT NULL, trial_conversions BIGINT NOT NULL, renewals BIGINT NOT NULL, paid_started BIGINT NOT NULL, sales BIGINT NOT NULL, refunds BIGINT NOT NULL, gross_micros BIGINT NOT NULL, net_micros BIGINT NOT NULL, active_subscriptions BIGINT NOT NULL, active_trials BIGINT NOT NULL, mrr_micros BIGINT NOT NULL, trials_ended BIGINT NOT NULL, churned BIGINT NOT NULL, churned_voluntary BIGINT NOT NULL, churned_billing BIGINT NOT NULL,
            PRIMARY KEY (app_id, environment, day, currency))
            """,
            // Covering, in the order a question groups by: years of days are read from the index alone, in order.
            """
            CREATE INDEX metrics_days_read ON metrics_days (app_id, day, currency, environment, new_subscriptions, trials_started, trial_conversions,
            renewals, paid_started, sales, refunds, gross_micros, net_micros, active_subscriptions, active_trials, mrr_micros, trials_ended, churned,
            churned_voluntary, churned_billing)
            """,
            "INSERT INTO metrics_dirty SELECT DISTINCT app_id, environment, original_transaction_id FROM ledger WHERE true ON CONFLICT DO NOTHING",
        ]),
        // The console's people: operators with a role and a scrypt password hash, their sessions (the cookie's SHA-256
        // and the session's CSRF token) and one-time login links (their SHA-256).
        SQLMigration(version: 15, statements: [
            "CREATE TABLE operators (email TEXT PRIMARY KEY, role TEXT NOT NULL, password_hash TEXT, created_at BIGINT NOT NULL)",
            """
            CREATE TABLE operator_sessions (token_hash TEXT PRIMARY KEY, email TEXT NOT NULL, csrf TEXT NOT NULL, created_at BIGINT NOT NULL,
            expires_at BIGINT NOT NULL)
            """,
            "CREATE INDEX operator_sessions_email ON operator_sessions (email)",
            "CREATE TABLE operator_login_links (token_hash TEXT PRIMARY KEY, email TEXT NOT NULL, expires_at BIGINT NOT NULL, used_at BIGINT)",
        ]),
        // Which period a subscription's expiry and revocation are of: the purchase date of the transaction they came
        // from, so news about an older transaction (a refund of a past period) cannot overwrite the current one's.
        SQLMigration(version: 16, statements: [
            "ALTER TABLE subscriptions ADD COLUMN period_purchase_date BIGINT",
        ]),
        // A refund of part of the price (REFUND_PRORATED): the refunded share in milliunits of the whole; NULL is all of it.
        SQLMigration(version: 17, statements: [
            "ALTER TABLE ledger ADD COLUMN refund_percentage INTEGER",
        ]),
        // Claims look for expired leases among the jobs being verified: by their expiry, not by reading every job in
        // flight (thousands while Apple is slow).
        SQLMigration(version: 18, statements: [
            "CREATE INDEX verification_jobs_lease ON verification_jobs (state, lease_expires_at)",
        ]),
        // An upload's receipt is stored as sent, without PostgreSQL's compression: Base64 gains little from it, and
        // compressing every upload cost more than any other part of writing it.
        SQLMigration(version: 19, statements: [
            "ALTER TABLE verification_jobs ALTER COLUMN receipt_data SET STORAGE EXTERNAL",
        ], dialect: .postgres),
        // A job's receipt in a table of its own, written once and read when the job is claimed: a claim and a settlement
        // change a small row, where rewriting the job's row rewrote its receipt too (on SQLite the whole record, its
        // overflow pages included). On PostgreSQL the jobs table is locked against writes first: another process still
        // inserting jobs between the copy and the drop would lose their receipts with the column. Its receipts are
        // stored uncompressed before any is copied (as migration 19 did for the column).
        SQLMigration(version: 20, statements: [
            "LOCK TABLE verification_jobs IN SHARE MODE",
            "CREATE TABLE verification_receipts (job_id TEXT PRIMARY KEY, receipt_data TEXT NOT NULL)",
            "ALTER TABLE verification_receipts ALTER COLUMN receipt_data SET STORAGE EXTERNAL",
        ] + Self.receiptsMoved, dialect: .postgres),
        // SQLite: the migration's transaction already holds the only write lock.
        SQLMigration(version: 21, statements: [
            "CREATE TABLE verification_receipts (job_id TEXT PRIMARY KEY, receipt_data TEXT NOT NULL)",
        ] + Self.receiptsMoved, dialect: .sqlite),
        // `ownership_user` (app id, user) is the start of `ownership_by_user` (migration 2), which answers every lookup
        // by user on its own: the shorter index only cost every grant a second index write. `IF EXISTS`: an operator may
        // have dropped it already, and two processes starting at once may both run this.
        SQLMigration(version: 22, statements: [
            "DROP INDEX IF EXISTS ownership_user",
        ]),
        // Expired leases are looked for among the jobs being verified only. Migration 18's index began with the state and
        // held every job ever uploaded, each written again at its upload, claim and settlement; this one holds the jobs
        // in flight (on PostgreSQL writes to the jobs table wait while it is built, as for migration 18). The state stays
        // its first column: SQLite, without statistics, otherwise prefers the index of due jobs, which begins with it too.
        SQLMigration(version: 23, statements: [
            "CREATE INDEX IF NOT EXISTS verification_jobs_lapsing ON verification_jobs (state, lease_expires_at) WHERE state = 'verifying'",
            "DROP INDEX IF EXISTS verification_jobs_lease",
        ]),
        // Running totals of settled jobs and delivered webhooks (`StateTotalsRepository`): counting them by reading them
        // took a scan of every job ever uploaded and every delivery ever made for each `GET /metrics`, on SQLite on the
        // only writer. Started from a count of those so far. Nothing of this version settles before it is applied (a
        // process applies the migrations before it starts work), and what processes of the version before settle is
        // not counted however the tables are locked, so no lock is taken: the README says to stop them first.
        SQLMigration(version: 24, statements: Self.stateTotals),
        // A notification whose transaction nobody owns yet looks for the user whose id is its appAccountToken, compared
        // without case (`UserRepository.userByToken`): without this index, a scan of every user of the app on the
        // notification's write transaction, 0.46 s for a million users on SQLite here. The id itself is its last key:
        // SQLite, without statistics, prefers the primary key's index when it alone holds every column the query reads.
        // On PostgreSQL writes to the users table wait while it is built, as for migration 18.
        SQLMigration(version: 25, statements: [
            "CREATE INDEX IF NOT EXISTS users_by_token ON users (app_id, lower(app_user_id), app_user_id)",
        ]),
        // Two gauges every `GET /metrics` reads (`HealthRepository`), on SQLite on the only writer. The newest notification
        // walked every entry of the notifications' index by app (notifications are never deleted: 0.67 s for two million
        // here); the oldest pending webhook delivery looked up every pending delivery's row (an endpoint down for its 72 hours
        // of retries leaves them all pending: 0.84 s for a million). Each is now one index entry away. The deliveries' index
        // holds only what is pending and begins with the state: SQLite, without statistics, otherwise keeps to the index of
        // due deliveries, which begins with it too.
        SQLMigration(version: 26, statements: [
            "CREATE INDEX IF NOT EXISTS apple_notifications_received ON apple_notifications (received_at)",
            "CREATE INDEX IF NOT EXISTS webhook_deliveries_pending ON webhook_deliveries (state, created_at) WHERE state = 'pending'",
        ]),
        // A customer's notifications (the support timeline, `CustomerRepository.notificationsSQL`) are those of the
        // subscriptions they own: without this index, a walk of every notification of the app, newest first, until a page
        // of theirs was found (all of them for a customer with fewer). Each chain is now a few index entries away.
        SQLMigration(version: 27, statements: [
            "CREATE INDEX IF NOT EXISTS apple_notifications_chain ON apple_notifications (app_id, original_transaction_id, received_at)",
        ]),
        // The admin listing of ledger rows, newest first (`LedgerReader.rows`): one app's listing looked up and sorted every
        // row of the app (7.5 s for two million on SQLite here), each time. Each app's newest rows are now at the end of
        // `ledger_recorded`, and a user's at the end of their part of `ledger_user_recorded`, which replaces `ledger_user`
        // (its start): with only the first, SQLite walked the whole app's rows backwards for a user who has none. On
        // PostgreSQL writes to the ledger wait while they are built, as for migration 18.
        SQLMigration(version: 28, statements: [
            "CREATE INDEX IF NOT EXISTS ledger_recorded ON ledger (app_id, recorded_at)",
            "CREATE INDEX IF NOT EXISTS ledger_user_recorded ON ledger (app_id, app_user_id, recorded_at)",
            "DROP INDEX IF EXISTS ledger_user",
        ]),
        // Each JWS header a stored JWS names by its SHA-256 (`StoredJWS`): Apple's certificate chain, about 4.4 KB, was
        // stored whole in every notification, three times (the envelope's, and those of the JWS it carries). Rows
        // already stored stay as they are and read the same.
        SQLMigration(version: 29, statements: [
            "CREATE TABLE IF NOT EXISTS jws_headers (digest TEXT PRIMARY KEY, header TEXT NOT NULL)",
        ]),
        // A user named by an appAccountToken (`UserRepository.userByToken`) is looked up by the primary key, the token in
        // lower and in upper case; the index only holds 36-character ids in mixed case, the others a token can name
        // (with the id as its last key, as migration 25's: SQLite otherwise walks the app's part of the primary key).
        // Migration 25's index held every user: one more page of an index in no useful order written for each new
        // customer, whose id (a UUID, say) falls anywhere in it (bench/README, forty-fifth round). On PostgreSQL writes to
        // the users table wait while it is built, as for migration 25, and reads of it too while the old one is dropped.
        SQLMigration(version: 30, statements: [
            """
            CREATE INDEX IF NOT EXISTS users_by_mixed_case_id ON users (app_id, lower(app_user_id), app_user_id)
            WHERE length(app_user_id) = 36 AND app_user_id <> lower(app_user_id) AND app_user_id <> upper(app_user_id)
            """,
            "DROP INDEX IF EXISTS users_by_token",
        ]),
    ]

    /// The totals table, filled with the counts so far.
    private static let stateTotals = [
        """
        CREATE TABLE IF NOT EXISTS state_totals (
            subject TEXT NOT NULL, state TEXT NOT NULL, shard BIGINT NOT NULL, total BIGINT NOT NULL,
            PRIMARY KEY (subject, state, shard)
        )
        """,
        """
        INSERT INTO state_totals (subject, state, shard, total)
        SELECT 'verification_jobs', state, 0, COUNT(*) FROM verification_jobs WHERE state IN ('verified', 'rejected') GROUP BY state
        ON CONFLICT DO NOTHING
        """,
        """
        INSERT INTO state_totals (subject, state, shard, total)
        SELECT 'webhook_deliveries', state, 0, COUNT(*) FROM webhook_deliveries WHERE state = 'delivered' GROUP BY state
        ON CONFLICT DO NOTHING
        """,
    ]

    /// Every stored receipt copied to `verification_receipts`, then the jobs' column dropped.
    private static let receiptsMoved = [
        "INSERT INTO verification_receipts (job_id, receipt_data) SELECT id, receipt_data FROM verification_jobs WHERE receipt_data <> ''",
        "ALTER TABLE verification_jobs DROP COLUMN receipt_data",
    ]
}

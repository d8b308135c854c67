"""Writes a grown ledger straight into a purchase server's SQLite database (already migrated, with the app
registered): USERS users, each with one subscription chain (weekly, monthly or yearly; some with a trial,
some refunded, some lapsed, some still renewing) and a few consumables, until ROWS ledger rows. Ownership
and users rows come with it, and every chain is marked for the metrics rollup, as a restored backup would be.

With --no-rollup no chain is marked (the metrics rollup is left out, for benchmarks of the ledger path only).

usage: generate_ledger.py DATABASE APP USERS ROWS [SEED] [--no-rollup]
"""
import random
import sqlite3
import sys
import time

DAY = 86_400_000

def main():
    rollup = "--no-rollup" not in sys.argv
    arguments = [argument for argument in sys.argv[1:] if argument != "--no-rollup"]
    path, app, users, rows = arguments[0], arguments[1], int(arguments[2]), int(arguments[3])
    rng = random.Random(int(arguments[4]) if len(arguments) > 4 else 11)
    now = int(time.time() * 1000)
    begin = now - 3 * 365 * DAY
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA synchronous = OFF")
    db.execute("BEGIN")
    ledger, owners, people = [], [], []
    written = 0
    plans = [("magazine.weekly", 7 * DAY, "2.99"), ("magazine.monthly", 30 * DAY, "9.99"), ("magazine.yearly", 365 * DAY, "59.99")]

    def flush():
        db.executemany("INSERT INTO ledger (environment, transaction_id, app_id, app_user_id, product_id, product_type, quantity, purchase_date,"
                       " original_purchase_date, original_transaction_id, web_order_line_item_id, expires_date, price, currency, source,"
                       " verification_id, cancellation_date, cancellation_reason, is_trial, recorded_at, state_date)"
                       " VALUES (?, ?, ?, ?, ?, ?, 1, ?, ?, ?, NULL, ?, ?, ?, 'generated', 'generated', ?, NULL, ?, ?, ?)", ledger)
        db.executemany("INSERT INTO ownership (app_id, environment, original_transaction_id, app_user_id, product_id, granted_at)"
                       " VALUES (?, 'Production', ?, ?, ?, ?)", owners)
        db.executemany("INSERT INTO users (app_id, app_user_id, flagged, created_at) VALUES (?, ?, 0, ?)", people)
        ledger.clear(); owners.clear(); people.clear()

    transaction = 0
    for user in range(users):
        name = f"user-{user:08d}"
        # Rows still owed, spread over the users still to come (the last one takes what is left).
        remaining = rows - written
        if remaining <= 0:
            break
        average = remaining / (users - user)
        budget = remaining if user == users - 1 else min(remaining, max(1, round(rng.expovariate(1 / average))))
        product, length, price = plans[rng.choices([0, 1, 2], [15, 70, 15])[0]]
        consumables = budget // 5
        periods = budget - consumables
        # Chains end around now: some lapsed long ago, some still renewing.
        start = max(begin - 365 * DAY, now - int(periods * length * rng.uniform(0.5, 1.5)))
        original = f"1{transaction:015d}"
        people.append((app, name, start))
        owners.append((app, original, name, product, start))
        before = len(ledger)
        if rng.random() < 0.3:
            transaction += 1
            ledger.append(("Production", f"1{transaction:015d}", app, name, product, "auto-renewable", start, start, original,
                           start + 7 * DAY, "0", "USD", None, 1, start, start))
            start += 7 * DAY
            periods -= 1
        currency = rng.choice(["USD", "USD", "USD", "EUR", "JPY"])
        for period in range(max(0, periods)):
            transaction += 1
            refunded = start + rng.randrange(length) if rng.random() < 0.02 else None
            if refunded is not None and refunded > now:
                refunded = None
            ledger.append(("Production", f"1{transaction:015d}", app, name, product, "auto-renewable", start, start, original,
                           start + length, price, currency, refunded, 0, start, start))
            start += length
            if start > now + length:
                break
        for _ in range(consumables):
            transaction += 1
            bought = begin + rng.randrange(3 * 365 * DAY)
            ledger.append(("Production", f"1{transaction:015d}", app, name, "coins.100", "consumable", bought, bought, f"1{transaction:015d}",
                           None, "0.99", currency, None, 0, bought, bought))
        written += len(ledger) - before
        if len(ledger) >= 50_000:
            flush()
    flush()
    if rollup:
        db.execute("INSERT INTO metrics_dirty SELECT DISTINCT app_id, environment, original_transaction_id FROM ledger WHERE true ON CONFLICT DO NOTHING")
    db.execute("COMMIT")
    count = db.execute("SELECT COUNT(*) FROM ledger").fetchone()[0]
    chains = db.execute("SELECT COUNT(*) FROM metrics_dirty").fetchone()[0]
    print(f"generated {count:,} ledger rows in {chains:,} chains")

main()

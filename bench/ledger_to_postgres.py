"""Copies a generated ledger (users, ownership, ledger, balances) from a purchase server's SQLite database into a
PostgreSQL database the server has already migrated, with COPY through psql, then analyzes the tables.

usage: ledger_to_postgres.py SQLITE_DATABASE POSTGRES_URL
"""
import sqlite3
import subprocess
import sys
import time

TABLES = ["users", "ownership", "ledger", "balances"]


def field(value):
    """NULL is an unquoted empty field in PostgreSQL's CSV; every string is quoted (so an empty one stays a string)."""
    if value is None:
        return ""
    if isinstance(value, (int, float)):
        return str(value)
    return '"' + str(value).replace('"', '""') + '"'


def copy(source, url, table):
    columns = [row[1] for row in source.execute(f"PRAGMA table_info({table})")]
    command = f"\\copy {table} ({', '.join(columns)}) FROM STDIN WITH (FORMAT csv)"
    psql = subprocess.Popen(["psql", url, "-q", "-v", "ON_ERROR_STOP=1", "-c", command], stdin=subprocess.PIPE, text=True)
    count = 0
    for row in source.execute(f"SELECT {', '.join(columns)} FROM {table}"):
        psql.stdin.write(",".join(field(value) for value in row) + "\n")
        count += 1
    psql.stdin.close()
    if psql.wait() != 0:
        sys.exit(f"copying {table} failed")
    return count


def main():
    path, url = sys.argv[1], sys.argv[2]
    source = sqlite3.connect(path)
    started = time.time()
    for table in TABLES:
        print(f"copied {copy(source, url, table):,} rows of {table}", flush=True)
    subprocess.run(["psql", url, "-qc", "ANALYZE"], check=True)
    print(f"copied to PostgreSQL in {time.time() - started:.0f} s")


main()

#!/usr/bin/env bash
# Starts or stops a throwaway PostgreSQL on loopback for the test suites: scripts/postgres.sh start|stop|url|pid
set -euo pipefail
PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
DIR=${STOREKEEPER_PG_DIR:-/tmp/storekeeper-pg}
PORT=${STOREKEEPER_PG_PORT:-55432}
URL="postgresql://postgres@127.0.0.1:$PORT/storekeeper_test"

as_owner() {  # PostgreSQL refuses to run as root: use the postgres user then.
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

case "${1:-}" in
  start)
    [ -n "$PGBIN" ] || { echo "PostgreSQL is not installed (apt-get install postgresql)" >&2; exit 1; }
    mkdir -p "$DIR"
    [ "$(id -u)" = 0 ] && chown postgres "$DIR"
    if ! as_owner "$PGBIN/pg_ctl" -D "$DIR/data" status >/dev/null 2>&1; then
      # Not running: start from an empty cluster (the data is throwaway; a killed one may leave a stale pid file).
      rm -rf "$DIR/data"
      as_owner "$PGBIN/initdb" -D "$DIR/data" -A trust -U postgres --no-sync >/dev/null
      # WAL as a production server would size it: with the default 1 GB, a grown ledger's settlements (random pages,
      # each written whole after every checkpoint) forced a checkpoint every 6-35 s (STOREKEEPER_PG_OPTIONS adds more).
      # 300 connections: the Swift suites run tests in parallel, each with a pool of its own (one run of 2026-12-05 was
      # refused past 200).
      # The port is in the kernel's range of ephemeral ports: a connection the suites or benchmarks just made from it
      # (to another service on loopback) can hold it for a minute (TIME_WAIT), and the start fails. Tried again for 75 s.
      for attempt in $(seq 16); do
        : > "$DIR/server.log"; [ "$(id -u)" = 0 ] && chown postgres "$DIR/server.log"
        as_owner "$PGBIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w \
          -o "-c listen_addresses=127.0.0.1 -p $PORT -k $DIR -c fsync=off -c max_connections=300 -c max_wal_size=8GB -c wal_compression=on ${STOREKEEPER_PG_OPTIONS:-}" start >/dev/null \
          && break
        grep -q "Address already in use" "$DIR/server.log" && [ "$attempt" -lt 16 ] || { cat "$DIR/server.log" >&2; exit 1; }
        echo "port $PORT in use; starting PostgreSQL again in 5 s" >&2
        sleep 5
      done
    fi
    as_owner "$PGBIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname='storekeeper_test'" postgres | grep -q 1 \
      || as_owner "$PGBIN/createdb" -h 127.0.0.1 -p "$PORT" -U postgres storekeeper_test
    echo "$URL"
    ;;
  stop)
    [ -f "$DIR/data/PG_VERSION" ] && as_owner "$PGBIN/pg_ctl" -D "$DIR/data" -m fast -w stop >/dev/null 2>&1 || true
    ;;
  url)
    echo "$URL"
    ;;
  pid)  # the postmaster's pid (its backends are its children)
    head -1 "$DIR/data/postmaster.pid"
    ;;
  *)
    echo "usage: $0 start|stop|url|pid" >&2
    exit 64
    ;;
esac

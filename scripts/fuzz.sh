#!/usr/bin/env bash
# Runs each libFuzzer harness for $FUZZ_SECONDS: scripts/fuzz.sh BINARY TARGET...
# The corpus of a run starts from Tests/fuzz/TARGET (kept inputs) and the real fixtures; what it
# learns goes to .build-fuzz/corpus/TARGET. A crash is minimised into Tests/fuzz/TARGET/crash-*,
# which `make test` replays from then on; the script then fails.
set -uo pipefail
cd "$(dirname "$0")/.."
binary=$1; shift
seconds=${FUZZ_SECONDS:-60}
fixtures=../shared/fixtures/real
failed=0
for target in "$@"; do
  corpus=.build-fuzz/corpus/$target
  mkdir -p "$corpus" "Tests/fuzz/$target"
  cp -n Tests/fuzz/"$target"/* "$corpus"/ 2>/dev/null
  case $target in
    receipt) cp -n "$fixtures"/*.receipt.b64 ../shared/fixtures/xcode/*.b64 "$corpus"/ 2>/dev/null ;;
    jws) cp -n "$fixtures"/*.jws "$corpus"/ 2>/dev/null ;;
    json) cp -n "$fixtures"/*.json "$corpus"/ 2>/dev/null ;;
    catalog) cp -n examples/*.storekit "$corpus"/ 2>/dev/null ;;
  esac
  # The request harness returns when the answer is ready, while the server's own tasks (long-poll timers,
  # the notification queue) still hold memory: LeakSanitizer would call that a leak on random inputs.
  leaks=1; [ "$target" = http-request ] && leaks=0
  artifacts=.build-fuzz/artifacts/$target/
  mkdir -p "$artifacts"
  echo "== $target: ${seconds}s"
  FUZZ_TARGET=$target "$binary" "$corpus" -max_total_time="$seconds" -max_len=262144 -rss_limit_mb=4096 -timeout=20 -detect_leaks=$leaks \
    -artifact_prefix="$artifacts" -print_final_stats=1 2>&1 | grep -E "^#[0-9]+.*(DONE|pulse)|stat::number_of_executed_units|ERROR|SUMMARY|Test unit written" | tail -6
  for crash in "$artifacts"crash-* "$artifacts"timeout-* "$artifacts"oom-* "$artifacts"leak-*; do
    [ -e "$crash" ] || continue
    name=$(basename "$crash")
    FUZZ_TARGET=$target "$binary" -minimize_crash=1 -runs=2000 -exact_artifact_path="Tests/fuzz/$target/$name" "$crash" >/dev/null 2>&1 \
      || cp "$crash" "Tests/fuzz/$target/$name"
    echo "   kept Tests/fuzz/$target/$name"
    rm -f "$crash"
    failed=1
  done
done
exit $failed

# Storekeeper — `make run` and `make test` set everything up on a fresh Debian machine with Swift.
SHELL := /bin/bash
.DEFAULT_GOAL := help

DEB_PACKAGES := pkg-config libmicrohttpd-dev libnghttp2-dev libjemalloc-dev libssl-dev libsqlite3-dev libpq-dev postgresql openssl python3-venv wrk tmux chromium
PY_PACKAGES := pytest pyyaml app-store-server-library inapppy itunes-iap schemathesis cryptography prometheus-client playwright axe-playwright-python
VENV := .venv
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APPSTORE_PORT ?= 8010
SERVER_PORT ?= 8020
DATA ?= ./.storekeeper

CATALOGS := --catalog com.example.coins=examples/coins.storekit \
            --catalog com.example.football=examples/football.storekit \
            --catalog com.example.comics=examples/comics.storekit \
            --catalog com.example.magazine=examples/magazine.storekit

.PHONY: help deps pydeps build release install run appstore test test-swift test-acceptance bench bench-ab callgrind fuzz soak-model sanitize clean

FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= der receipt legacy-receipt jws json catalog http-response http-request

help:
	@echo "make run    install what is missing, build, start the App Store emulator and the purchase server (storekeeper up)"
	@echo "make test   install what is missing, run the Swift suites and the acceptance suites"
	@echo "make bench  build release and print benchmark figures (written under bench/results/; bench/steady.sh alone runs about 45 minutes)"
	@echo "make bench-ab BASE=<revision>  the emulator of that revision (built in .build/ab-base) against this tree's, side by side"
	@echo "make callgrind  the purchase server's instructions per notification and per receipt under valgrind (about 2 minutes; repeatable where timings are not)"
	@echo "make install [PREFIX=/usr/local]  install the storekeeper binary (the example stores are built into it)"
	@echo "make fuzz   run every libFuzzer harness for FUZZ_SECONDS (default 60) each; crashes are kept under Tests/fuzz/"
	@echo "make sanitize  run the Swift suites under ThreadSanitizer and AddressSanitizer"
	@echo "make soak-model SCRIPTS=N [SEED=S]  run N random lifecycle scripts against the emulator's truth (make test runs 300)"

deps:
	@missing=""; for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "installing:$$missing"; $(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi

pydeps: deps
	@[ -x $(VENV)/bin/python ] || python3 -m venv $(VENV)
	@$(VENV)/bin/python -c "import pytest, yaml, appstoreserverlibrary, inapppy, itunesiap, schemathesis, cryptography, prometheus_client, playwright, axe_playwright_python" 2>/dev/null || $(VENV)/bin/pip install -q $(PY_PACKAGES)

build: deps
	swift build

release: deps
	swift build -c release

PREFIX ?= /usr/local
# The one binary, with the example stores built in: it runs from anywhere.
install: release
	install -D -m 0755 .build/release/storekeeper $(DESTDIR)$(PREFIX)/bin/storekeeper

run: release
	.build/release/storekeeper up --data $(DATA) --appstore-port $(APPSTORE_PORT) --server-port $(SERVER_PORT)

appstore: release
	.build/release/storekeeper appstore serve --data $(DATA)/appstore --port $(APPSTORE_PORT) $(CATALOGS) --tester sandbox@example.com

# Every suite runs against SQLite and against a throwaway PostgreSQL on loopback, stopped at the end.
test: pydeps
	scripts/check-layers.sh
	swift build
	@pg_url=$$(scripts/postgres.sh start) || exit 1; \
	trap 'scripts/postgres.sh stop' EXIT; \
	export STOREKEEPER_TEST_POSTGRES=$$pg_url STOREKEEPER_BIN=$(CURDIR)/.build/debug/storekeeper; \
	swift test && $(VENV)/bin/python -m pytest -q Tests/acceptance
	@# make run builds with -c release, where the optimiser has crashed on code the debug build takes: build it too.
	swift build -c release --product storekeeper

test-swift: deps
	swift test

test-acceptance: pydeps
	swift build
	@pg_url=$$(scripts/postgres.sh start) || exit 1; trap 'scripts/postgres.sh stop' EXIT; \
	STOREKEEPER_TEST_POSTGRES=$$pg_url STOREKEEPER_BIN=$(CURDIR)/.build/debug/storekeeper $(VENV)/bin/python -m pytest -q Tests/acceptance

bench: release pydeps
	swift build -c release --product storekeeper-bench
	bench/run.sh
	bench/server.sh
	bench/steady.sh
	bench/grown.sh
	bench/queue.sh
	bench/processes.sh
	bench/abuse.sh
	bench/webhooks.sh
	bench/metrics.sh
	bench/storekit2.sh
	bench/shop.sh
	$(MAKE) --no-print-directory callgrind

# Instructions counted by valgrind's callgrind: the same build gives the same figure within about a percent, whatever
# else the machine does, so two builds compare where wall-clock runs drift (bench/callgrind.sh).
callgrind: release pydeps
	@dpkg -s valgrind >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind; }
	swift build -c release --product storekeeper-bench
	bench/callgrind.sh

# Two builds compared side by side, batches alternated a second apart: the host's speed drifts within minutes, so a
# figure of one build taken after the other's does not compare.
bench-ab: release pydeps
	@[ -n "$(BASE)" ] || { echo "usage: make bench-ab BASE=<revision>"; exit 2; }
	@base=$$(git rev-parse --short --verify "$(BASE)^{commit}") || exit 2; \
	git worktree remove --force .build/ab-base 2>/dev/null; rm -rf .build/ab-base; \
	git worktree add --detach .build/ab-base "$$base" >/dev/null || exit 1; \
	trap 'git worktree remove --force .build/ab-base' EXIT; \
	(cd .build/ab-base && swift build -c release --product storekeeper) || exit 1; \
	BENCH_AB_A_LABEL="$$base" BENCH_AB_B_LABEL="working tree at $$(git rev-parse --short HEAD)$$(git diff --quiet HEAD -- Sources || echo ', changed')" \
	bench/emulator_ab.sh .build/ab-base/.build/release/storekeeper .build/release/storekeeper

# libFuzzer with AddressSanitizer, in its own build directory; scripts/fuzz.sh seeds each run from Tests/fuzz/TARGET and
# the real fixtures, and minimises any crash into Tests/fuzz/TARGET/ (replayed by make test from then on).
fuzz: deps
	swift build --build-path .build-fuzz --product storekeeper-fuzz -Xswiftc -sanitize=fuzzer,address -Xswiftc -DFUZZING -Xswiftc -use-ld=lld
	FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/fuzz.sh .build-fuzz/debug/storekeeper-fuzz $(FUZZ_TARGETS)

SCRIPTS ?= 3000
soak-model: deps
	STOREKEEPER_MODEL_SCRIPTS=$(SCRIPTS) $(if $(SEED),STOREKEEPER_MODEL_SEED=$(SEED)) swift test --filter ModelTests

sanitize: deps
	@pg_url=$$(scripts/postgres.sh start) || exit 1; trap 'scripts/postgres.sh stop' EXIT; export STOREKEEPER_TEST_POSTGRES=$$pg_url; \
	export STOREKEEPER_MODEL_SCRIPTS=30; LSAN_OPTIONS=suppressions=$(CURDIR)/scripts/lsan.supp swift test --build-path .build-asan --sanitize=address && swift test --build-path .build-tsan --sanitize=thread -Xswiftc -DSTOREKEEPER_TSAN

clean:
	rm -rf .build $(VENV) $(DATA)

# Storekeeper — `make run` and `make test` set everything up on a fresh Debian machine with Swift.
SHELL := /bin/bash
.DEFAULT_GOAL := help

DEB_PACKAGES := pkg-config libmicrohttpd-dev libssl-dev libsqlite3-dev openssl python3-venv wrk
PY_PACKAGES := pytest pyyaml app-store-server-library inapppy itunes-iap
VENV := .venv
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APPSTORE_PORT ?= 8010
DATA ?= ./.storekeeper

CATALOGS := --catalog com.example.coins=examples/coins.storekit \
            --catalog com.example.football=examples/football.storekit \
            --catalog com.example.comics=examples/comics.storekit \
            --catalog com.example.magazine=examples/magazine.storekit

.PHONY: help deps pydeps build release run test test-swift test-acceptance bench clean

help:
	@echo "make run    install what is missing, build, start the App Store emulator with the example catalogs"
	@echo "make test   install what is missing, run the Swift suites and the acceptance suites"
	@echo "make bench  build release and print benchmark figures (written under bench/results/)"

deps:
	@missing=""; for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "installing:$$missing"; $(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi

pydeps: deps
	@[ -x $(VENV)/bin/python ] || python3 -m venv $(VENV)
	@$(VENV)/bin/python -c "import pytest, yaml, appstoreserverlibrary, inapppy, itunesiap" 2>/dev/null || $(VENV)/bin/pip install -q $(PY_PACKAGES)

build: deps
	swift build

release: deps
	swift build -c release

run: release
	@echo
	@echo "App Store emulator on http://127.0.0.1:$(APPSTORE_PORT) with the example stores; sandbox tester sandbox@example.com."
	@echo "Try, in another terminal:"
	@echo "  .build/release/storekeeper appstore buy --app com.example.coins --product Nada.JPYF01 --account sandbox@example.com"
	@echo "  curl -s -X POST http://127.0.0.1:$(APPSTORE_PORT)/sandbox/verifyReceipt -d '{\"receipt-data\":\"<receipt from buy>\"}'"
	@echo "  .build/release/storekeeper appstore time advance 5m     # subscriptions renew (a month is 5 minutes in the sandbox)"
	@echo "  .build/release/storekeeper appstore fault add --endpoint verifyReceipt --latency 3s-6s"
	@echo
	.build/release/storekeeper appstore serve --data $(DATA) --port $(APPSTORE_PORT) $(CATALOGS) --tester sandbox@example.com

test: pydeps
	swift build
	swift test 2>&1 | tee .build/swift-test.log; exit $${PIPESTATUS[0]}
	STOREKEEPER_BIN=$(CURDIR)/.build/debug/storekeeper $(VENV)/bin/python -m pytest -q Tests/acceptance

test-swift: deps
	swift test

test-acceptance: pydeps
	swift build
	STOREKEEPER_BIN=$(CURDIR)/.build/debug/storekeeper $(VENV)/bin/python -m pytest -q Tests/acceptance

bench: release pydeps
	bench/run.sh

clean:
	rm -rf .build $(VENV) $(DATA)

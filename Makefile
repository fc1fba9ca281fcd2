# lockd — developer entry points. `make test` is the one test command (README,
# .ci/run). Targets are phony: they always run.

GO          ?= go
STATICCHECK ?= $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2
GOTESTSUM   ?= $(GO) run gotest.tools/gotestsum@v1.13.0
GOTESTFLAGS ?= -race -shuffle=on -timeout 20m

.PHONY: test fmt-check vet staticcheck gotest fuzz build

## test: everything CI checks — format, vet, staticcheck, generated code, all tests with -race.
test: fmt-check vet staticcheck check-generate gotest

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

staticcheck:
	$(STATICCHECK) ./...

## GOTEST_FIRST: the longest packages (quiet 2-core figures in
## docs/reliability.md, "CI time") are listed first so that go test, which
## starts test binaries in the order of its package list, does not leave one
## of them running alone at the end; ./... adds the rest (go test lists each
## package once).
## The middle-sized ones (test/abuse 80 s, internal/console 40 s,
## internal/backend 34 s, test/soak 29 s, test/chaos/runner 15 s) are
## listed too: left to ./...'s order they started last, and a clean-clone
## run's last 150 s were them and the small packages (r40, 2026-12-07).
GOTEST_FIRST ?= ./test/chaos/ ./store/pgstore/ ./test/sdk/ ./server/ ./test/parity/ ./internal/cli/ ./client/ ./store/etcdstore/ ./test/abuse/ ./internal/console/ ./internal/backend/ ./test/soak/ ./test/chaos/runner/
## test/chaos runs runner.CISuite by default, the short suite without the
## scenarios runner.ChaosOnly leaves to `make chaos` (every fault kind and
## every control stays; docs/reliability.md "CI time"). No LOCKD_ variable
## is set here: every package sees it, and lockd serve children refuse a
## LOCKD_ key that C5 lacks.
## gotest prints go test's own output (gotestsum's standard-quiet format) and
## then every test that took GOTEST_SLOWEST or longer, from the run's -json
## record, so that each CI log says where its time went (issue 21 "CI time").
## GOTEST_JSON names a file to keep that record in (default: a temporary one).
GOTEST_PKGS ?= $(GOTEST_FIRST) ./...
GOTEST_SLOWEST ?= 15s
GOTEST_JSON ?=
gotest:
	@json="$(GOTEST_JSON)"; tmp=; if [ -z "$$json" ]; then json=$$(mktemp); tmp=$$json; fi; status=0; \
	$(GOTESTSUM) --format standard-quiet --jsonfile "$$json" -- $(GOTESTFLAGS) $(GOTEST_PKGS) || status=$$?; \
	echo "==> tests that took $(GOTEST_SLOWEST) or longer (gotestsum tool slowest):"; \
	$(GOTESTSUM) tool slowest --jsonfile "$$json" --threshold $(GOTEST_SLOWEST); \
	rm -f $$tmp; exit $$status

## fuzz: run every fuzz target for a number of executions (seed corpora live
## in testdata/fuzz; `make test` runs them as ordinary tests, and the
## brute-force run is this target of its own: it cost about 80 s of a CI
## run, most of it building the instrumented binaries; docs/reliability.md
## "CI time"). Counts, not durations: a duration-based -fuzztime races
## Go 1.26's fuzz coordinator on a loaded machine and fails with a bare
## "context deadline exceeded" and no crasher (golang/go#75804, fixed in Go
## 1.27). Each count is about 5 s of fuzzing on a quiet 2-core machine.
## FUZZSCALE multiplies them (make fuzz FUZZSCALE=20 for a longer run).
FUZZSCALE ?= 1
FUZZ_TARGETS := ./store:FuzzValidateKey:400000 ./internal/config:FuzzLoadYAML:15000 \
	./server:FuzzAPI:1500 ./internal/auth:FuzzParsePolicy:20000
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; rest=$${t#*:}; name=$${rest%%:*}; n=$$(( $${rest#*:} * $(FUZZSCALE) )); \
		echo "fuzz $$pkg $$name ($${n}x)"; \
		$(GO) test $$pkg -run '^$$' -fuzz "^$$name\$$" -fuzztime $${n}x -fuzzminimizetime 100x; \
	done

build:
	$(GO) build -o bin/lockd ./cmd/lockd

## release: static, trimmed, stripped, version-stamped lockd binaries for
## RELEASE_PLATFORMS in dist/, with dist/SHA256SUMS. Version, commit and
## modified flag come from git (override: make release VERSION=v1.2.3); lockd
## version prints them. Not part of `make test` (cross-building takes
## minutes); test/packaging builds the host target with the same flags.
VERSION           ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT            ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
MODIFIED          ?= $(shell if [ -z "$$(git status --porcelain 2>/dev/null)" ]; then echo false; else echo true; fi)
RELEASE_PLATFORMS ?= linux/amd64 linux/arm64
CLI_PKG           := lock.dev/lockd/internal/cli
RELEASE_LDFLAGS    = -s -w -X $(CLI_PKG).version=$(VERSION) -X $(CLI_PKG).commit=$(COMMIT) -X $(CLI_PKG).modified=$(MODIFIED)

.PHONY: release package-check

release:
	rm -rf dist && mkdir -p dist
	@set -e; for p in $(RELEASE_PLATFORMS); do \
		os=$${p%/*}; arch=$${p#*/}; out=dist/lockd-$(VERSION)-$$os-$$arch; \
		echo "build $$out"; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -ldflags "$(RELEASE_LDFLAGS)" -o $$out ./cmd/lockd; \
	done
	cd dist && sha256sum lockd-* > SHA256SUMS && cat SHA256SUMS

## package-check: validate deploy/ (issue 16 §3) with test/packaging, a
## module of its own (helm and k8s.io/api stay out of lockd's go.mod):
## systemd-analyze verify/security on the unit and lockd started with the
## example lockd.yaml; the Containerfile through BuildKit's parser and linter
## and its ENTRYPOINT/ENV/HEALTHCHECK run as lockd; helm lint --strict and
## helm template (helm pinned by the tool line of test/packaging/go.mod) for
## every mode, manifests decoded strictly into k8s.io/api types. Needs
## systemd-analyze (Debian: systemd). The first run builds helm: minutes.
package-check:
	cd test/packaging && $(GO) vet ./... && $(STATICCHECK) ./... && $(GO) test $(GOTESTFLAGS) -count=1 ./...

## generate: regenerate proto/lockd/v1 from lockd.proto. Tools: protoc from
## Debian's protobuf-compiler with its recommended libprotobuf-dev, which
## holds google/protobuf/timestamp.proto in /usr/include
## (apt-get install -y protobuf-compiler libprotobuf-dev) and
##   go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
##   go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
##   go install github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-grpc-gateway@v2.34.0
##   go install github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-openapiv2@v2.34.0
## (.ci/run installs the same versions; the gateway's runtime in go.mod is
## the same v2.34.0). The HTTP/JSON routes are in HTTP_RULES, not in the
## proto (docs/contracts/C2.md #ct2-http): a new RPC served over HTTP needs
## one rule there. The OpenAPI document is lockd.swagger.json.
PROTOC ?= protoc
PROTOS := proto/lockd/v1/lockd.proto
HTTP_RULES := proto/lockd/v1/lockd_http.yaml

.PHONY: generate check-generate generate-python generate-ts

generate:
	PATH="$$($(GO) env GOPATH)/bin:$$PATH" $(PROTOC) -I proto -I /usr/include \
		--go_out=. --go_opt=module=lock.dev/lockd \
		--go-grpc_out=. --go-grpc_opt=module=lock.dev/lockd \
		--openapiv2_out=proto --openapiv2_opt=grpc_api_configuration=$(HTTP_RULES) \
		--openapiv2_opt=json_names_for_fields=false \
		$(PROTOS)
	@# The gateway is a package of its own (standalone), so that the SDK,
	@# which imports proto/lockd/v1, never links grpc-gateway.
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	PATH="$$($(GO) env GOPATH)/bin:$$PATH" $(PROTOC) -I proto -I /usr/include \
		--grpc-gateway_out="$$tmp" --grpc-gateway_opt=paths=source_relative \
		--grpc-gateway_opt=standalone=true --grpc-gateway_opt=grpc_api_configuration=$(HTTP_RULES) \
		$(PROTOS) && \
	mkdir -p proto/lockd/v1/gateway && mv "$$tmp/lockd/v1/lockd.pb.gw.go" proto/lockd/v1/gateway/lockd.pb.gw.go

## generate-python: regenerate the Python SDK's stubs in sdk/python/lockd/v1
## (sdk/python/generate.sh: Debian's protoc 3.21.12 and grpc_python_plugin
## 1.51.1 from protobuf-compiler-grpc, matching python3-protobuf and
## python3-grpcio).
generate-python:
	sdk/python/generate.sh

## generate-ts: regenerate the TypeScript SDK's messages in
## sdk/typescript/src/gen with protoc and @bufbuild/protoc-gen-es, pinned to
## an exact version in sdk/typescript/package.json and installed by npm ci
## from its package-lock.json (node_modules stays in sdk/typescript,
## ignored by git).
generate-ts:
	cd sdk/typescript && npm ci --no-audit --no-fund --prefer-offline >/dev/null && \
	$(PROTOC) -I ../../proto -I /usr/include --plugin=protoc-gen-es=node_modules/.bin/protoc-gen-es \
		--es_out=src/gen --es_opt=target=ts,import_extension=js lockd/v1/lockd.proto

## check-generate: fail when regenerating changes the committed generated code
## (the Go code in proto/, the Python stubs in sdk/python/lockd/v1 and the
## TypeScript messages in sdk/typescript/src/gen).
GENERATED := proto/ sdk/python/lockd/v1/ sdk/typescript/src/gen/
check-generate: generate generate-python generate-ts
	@git diff --exit-code -- $(GENERATED) || { echo "check-generate: generated code differs; run make generate generate-python generate-ts and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- $(GENERATED))" || { git status --porcelain -- $(GENERATED); echo "check-generate: uncommitted generated files"; exit 1; }

## typescript-sdk: the TypeScript SDK alone (test/sdk TestTypeScriptSDK):
## npm ci, one tsc build, its unit tests and its integration tests against
## lockd on embedded etcd and PostgreSQL, replicas, TLS and tokens.
.PHONY: typescript-sdk
typescript-sdk:
	$(GO) test -race -count=1 -timeout 15m -run '^TestTypeScriptSDK$$' -v ./test/sdk/

## parity: the backend parity suite (T-034, test/parity): every scenario
## through the gRPC API on embedded etcd, an external etcd process
## (test/cmd/etcd) and PostgreSQL, each also over TLS (rows etcd-tls, pg-tls),
## with lockd as a real child process; TestParityPython runs the scenarios
## that apply through the Python SDK's JSON-lines agent
## (sdk/python/lockd/_agent.py) on the base rows and compares the outcomes.
## Prints one row per scenario and backend: scenario | backend | outcome | ok.
## TestParityTypeScript does the same through the TypeScript SDK's agent.
## The same tests also run in `make test` (go test ./...), there on the base
## rows only (embedded, etcd, pg: the TLS rows change lockd's transport to
## its backend, LOCKD_PARITY_ROWS, test/parity/parity_test.go) and with the
## SDK agents on one store each (Python on PostgreSQL, TypeScript on
## embedded etcd; each SDK's own suite runs on both stores in test/sdk:
## LOCKD_PARITY_SDK_ROWS, test/parity/sdkagent_test.go; the agents' replica scenarios on the pg
## replica row, LOCKD_PARITY_SDK_REPLICA_ROWS); here on every row.
.PHONY: parity
parity:
	LOCKD_PARITY_ROWS=all LOCKD_PARITY_SDK_ROWS=all LOCKD_PARITY_SDK_REPLICA_ROWS=all $(GO) test -race -count=1 -timeout 15m -run '^TestParity(Replicas|Python|TypeScript)?$$' -v ./test/parity/

## python-sdk: the Python SDK's tests (sdk/python/tests: the timing rules
## under a fake clock with their controls, and integration tests against
## real lockd on etcd and PostgreSQL, TLS, tokens, replicas), run by
## test/sdk's TestPythonSDK with /usr/bin/python3 (python3-grpcio,
## python3-protobuf). `make test` runs it too. LOCKD_PYSDK_RUN=pattern
## focuses (unittest -k); PYSDK_DEBUG=1 logs the SDK's debug records.
.PHONY: python-sdk
python-sdk:
	$(GO) test -race -count=1 -timeout 10m -v -run '^TestPythonSDK$$' ./test/sdk/

## stress: issue 21 §1: the timing-sensitive packages (chaos short suite,
## test/parity, server, client, internal/cli) STRESS_N times each, one
## package at a time with -race, beside a CPU burner of one spinning
## goroutine per core; prints pass/fail counts per package and per test,
## the longest streak of passes, and keeps failed runs' output
## (test/cmd/stress). STRESS_PKGS picks packages (PKG or PKG:RUN).
STRESS_N    ?= 20
STRESS_PKGS ?=
STRESS_FLAGS ?=
.PHONY: stress
stress:
	$(GO) run ./test/cmd/stress -n $(STRESS_N) $(STRESS_FLAGS) $(STRESS_PKGS)

## brute: issue 12's brute force against a live session: 10^6 random
## session secrets per backend on a KeepAlive stream, every one refused
## (TestSessionSecretBruteForce; `make test` runs it with 1000).
BRUTE_ATTEMPTS ?= 1000000
.PHONY: brute
brute:
	LOCKD_TEST_BRUTE_ATTEMPTS=$(BRUTE_ATTEMPTS) $(GO) test -race -count=1 -timeout 60m -run '^TestSessionSecretBruteForce$$' -v ./server/

## abuse-flood: issue 23's F3 shutdown at its size: SIGTERM with 4000 sessions
## to close (TestF3ShutdownUnderSessionFlood; `make test` runs it with 300).
.PHONY: abuse-flood
abuse-flood:
	LOCKD_TEST_ABUSE_FLOOD=4000 $(GO) test -race -count=1 -timeout 10m -run '^TestF3ShutdownUnderSessionFlood$$' -v ./test/abuse/

## chaos: the fault-injection suite of issue 6 in short mode (every scenario
## and control, a few minutes; test/chaos). The checkers' own tests first.
## `make test` runs the short suite without runner.ChaosOnly's scenarios
## (TestChaos's default); this target runs all of them (LOCKD_CHAOS_SUITE=go).
## chaos-long: every scenario for about DURATION in all (make chaos-long DURATION=30m).
## See `go doc ./test/chaos` for the LOCKD_CHAOS_* settings.
DURATION ?= 10m

.PHONY: chaos chaos-long chaos-python chaos-typescript

chaos:
	$(GO) test -count=1 -timeout 5m ./test/chaos/history/ ./test/chaos/fenced/ ./test/chaos/check/ ./test/chaos/worker/ ./test/chaos/runner/
	LOCKD_CHAOS_SUITE=go $(GO) test -count=1 -timeout 15m -v -run 'TestChaos' ./test/chaos/
	LOCKD_CHAOS_SUITE=deadlock $(GO) test -count=1 -timeout 5m -v -run 'TestChaos' ./test/chaos/

## chaos-python: issue 25: the pause, kill-holder, long-partition and
## replica-kill scenarios with Python workers (sdk/python) on etcd and
## PostgreSQL, and the Python SDK's receive-time control (runner.PythonSuite;
## a few minutes, so not in `make test`). Needs /usr/bin/python3 with
## python3-grpcio and python3-protobuf (LOCKD_CHAOS_PYTHON to change it).
chaos-python:
	LOCKD_CHAOS_SUITE=python $(GO) test -race -count=1 -timeout 20m -v -run 'TestChaos' ./test/chaos/

## chaos-typescript: issue 25: the same scenarios with TypeScript workers
## (sdk/typescript, test/chaosworker.ts; built by npm ci into the suite's
## temporary directory) and the TypeScript SDK's receive-time control
## (runner.TypeScriptSuite). Needs node 20 and npm (LOCKD_CHAOS_NODE to
## change node).
chaos-typescript:
	LOCKD_CHAOS_SUITE=typescript $(GO) test -race -count=1 -timeout 20m -v -run 'TestChaos' ./test/chaos/

chaos-long:
	LOCKD_CHAOS_SUITE=go LOCKD_CHAOS_DURATION=$(DURATION) $(GO) test -count=1 -timeout 0 -v -run 'TestChaos' ./test/chaos/

## soak: the storage soak of issue 11 §5 (test/soak): full load on distinct keys
## for DURATION per backend (make soak DURATION=30m), embedded etcd with a
## 64 MiB quota, then PostgreSQL; fails unless stored keys, db size in use, RSS
## and goroutines stay flat and no request fails for space. LOCKD_SOAK_BACKENDS
## (etcd,pg) picks backends; SOAK_REPORT=file appends the summary lines. A short
## smoke of it (and its control) runs in `make test`.
SOAK_REPORT ?=
.PHONY: soak
soak:
	LOCKD_SOAK_DURATION=$(DURATION) LOCKD_SOAK_REPORT=$(SOAK_REPORT) $(GO) test -count=1 -timeout 0 -v -run '^TestSoak$$' ./test/soak/

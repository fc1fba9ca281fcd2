# lockd — developer entry points. `make test` is the one test command (README,
# .ci/run). Targets are phony: they always run.

GO          ?= go
STATICCHECK ?= $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2
GOTESTFLAGS ?= -race -shuffle=on -timeout 20m

.PHONY: test fmt-check vet staticcheck gotest build

## test: everything CI checks — format, vet, staticcheck, generated code, all tests with -race.
test: fmt-check vet staticcheck gotest

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

staticcheck:
	$(STATICCHECK) ./...

gotest:
	$(GO) test $(GOTESTFLAGS) ./...

build:
	$(GO) build -o bin/lockd ./cmd/lockd

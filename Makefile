# extworker: one command each for the main job and the tests, on a fresh machine.
#   make up     PostgreSQL + the engine under test (installed, built and started when needed)
#   make test   make up, then the whole Go suite with the race detector
#   make demo   make up, then the demo: invoices paid, declined (BPMN error) and one incident
#   make down   stop the engine and PostgreSQL
# ENGINE=camunda7 (default) | operaton | cibseven picks the engine; see README.md.

ENGINE ?= camunda7
export ENGINE
GO ?= go
GOTESTFLAGS ?=

.PHONY: up down pg-up engine-up test demo vet fmt

up: pg-up engine-up

pg-up:
	@bash testenv/pg-up.sh

engine-up: pg-up
	@bash testenv/engine-up.sh

down:
	@bash testenv/engine-down.sh
	@pg_ctlcluster $$(ls /usr/lib/postgresql | sort -n | tail -1) main stop 2>/dev/null || true

test: up
	$(GO) vet ./...
	$(GO) test -race -count=1 $(GOTESTFLAGS) ./...

demo: up
	$(GO) run ./cmd/extworker demo

vet:
	$(GO) vet ./...

fmt:
	gofmt -l -w $$(git ls-files '*.go')

# oversold: `make lab` runs the experiment, `make test` proves the code.
GO       ?= go
SERVERS  := mariadb-server redis-server redis-sentinel zookeeper etcd-server nginx
# The container testbed and the compose demo: an engine (unless dockerd is
# there already) and debootstrap for the stand-in images.
DOCKER_PKGS := $(shell command -v dockerd >/dev/null || echo docker.io) debootstrap
# chromium: the report's browser test (loadtest/report_browser_test.go).
TOOLS    := chromium
# make k8s-demo: the node's container runtime and pod network, kube-proxy's
# iptables and conntrack, nsenter (util-linux), sysctl and pgrep (procps), jq for the checks.
# Kubernetes itself is built from the Go module proxy (deploy/k8s/demo).
K8S_PKGS := containerd runc containernetworking-plugins iptables conntrack iproute2 util-linux procps jq
SUDO     := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)
ARGS     ?=
# Redocly CLI, pinned: npx keeps it in npm's cache after the first run.
REDOCLY  := @redocly/cli@2.77.0

.PHONY: deps lab test test-containers images compose-demo k8s-demo vet bench openapi-lint results results-labs

# Installs the Debian server packages that are missing; the project starts
# its own private servers from them, so none needs to run as a service.
deps:
	@missing=$$(for p in $(SERVERS) $(DOCKER_PKGS) $(TOOLS) $(K8S_PKGS); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing:" $$missing; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi
	@command -v npx >/dev/null || { echo "installing: nodejs npm"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq nodejs npm >/dev/null; }

lab: deps
	$(GO) run ./cmd/lab $(ARGS)

# The figures of README.md and docs/results.md, rewritten from the lab runs
# in docs/results/*.json (cmd/results); a test in make test checks them.
results:
	$(GO) run ./cmd/results

# Runs the labs behind docs/results/ again, one at a time (about half an
# hour on 2 cores), stores their results.json there, then rewrites the figures.
LABS := $(or $(TMPDIR),/tmp)/oversold-results
FAULTS := --fault pause-holder,delayed-write,kill-holder,redis-restart,redis-failover,redlock-node-restart \
	--repeat 5 --lock-ttl 1s --stock 20 --requests 60 --rate 200 --workers 16 --replicas 3
GATE_FAULTS := --fault redis-restart,redis-failover,kill-holder,crash-after-commit --backends none --gates redis \
	--stock 20 --requests 60 --rate 200 --workers 16 --replicas 3
# The queue's faults add most of an hour: each queue-redis-restart run waits
# out the 90 s drain for the orders it lost, each queue-consumer-kill run the
# 35 s claim bound.
QUEUE_FAULTS := --fault queue-consumer-kill,queue-redis-restart,queue-redis-restart-fsync,mysql-connection-kill \
	--backends none --gates redis --accept queue --stock 20 --requests 60 --rate 200 --workers 16 --replicas 3
results-labs: deps
	$(GO) run ./cmd/lab --out $(LABS)/default
	$(GO) run ./cmd/lab --out $(LABS)/sweep --sweep --backends none,redis,redlock,zookeeper,mysql,etcd \
		--guards none,version,fencing --replicas 3 --skus 1 --repeat 3
	$(GO) run ./cmd/lab --out $(LABS)/faults $(FAULTS) --backends redis,redlock,zookeeper,mysql,etcd --guards none,version,fencing
	$(GO) run ./cmd/lab --out $(LABS)/gate-sweep --sweep --backends none --guards atomic,none --gates none,redis \
		--replicas 3 --skus 1 --repeat 3
	$(GO) run ./cmd/lab --out $(LABS)/gate-sellout --sweep --backends none --guards atomic --gates none,redis \
		--stock 100 --requests 10000 --rate 100000 --replicas 3 --skus 1
	$(GO) run ./cmd/lab --out $(LABS)/gate-faults $(GATE_FAULTS) --guards atomic --repeat 20
	$(GO) run ./cmd/lab --out $(LABS)/gate-faults-version $(GATE_FAULTS) --guards version --repeat 20
	$(GO) run ./cmd/lab --out $(LABS)/gate-faults-trusting $(GATE_FAULTS) --guards none --repeat 5
	$(GO) run ./cmd/lab --out $(LABS)/queue --sweep --backends none --guards atomic --gates none,redis --accept sync,queue \
		--replicas 3 --skus 1 --requests 4000 --repeat 3
	$(GO) run ./cmd/lab --out $(LABS)/queue-faults $(QUEUE_FAULTS) --guards atomic --repeat 20
	$(GO) run ./cmd/lab --out $(LABS)/queue-faults-trusting $(QUEUE_FAULTS) --guards none --repeat 5
	$(GO) run ./cmd/results -import default=$(LABS)/default
	$(GO) run ./cmd/results -import sweep=$(LABS)/sweep
	$(GO) run ./cmd/results -import faults=$(LABS)/faults
	$(GO) run ./cmd/results -import gate=$(LABS)/gate-sweep,$(LABS)/gate-sellout,$(LABS)/gate-faults,$(LABS)/gate-faults-version,$(LABS)/gate-faults-trusting
	$(GO) run ./cmd/results -import queue=$(LABS)/queue,$(LABS)/queue-faults,$(LABS)/queue-faults-trusting

vet:
	$(GO) vet ./...

# order/openapi.json against Redocly's recommended rules, warnings as errors
# (order/redocly.yaml says which, and why four operations have no 4xx).
# Redocly CLI 2 needs Node 20.19 or later; Debian 12's own nodejs is 18, so
# there the lint says it is skipped rather than failing on the runtime.
openapi-lint:
	@if node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a > 20 || (a == 20 && b >= 19) ? 0 : 1)'; then \
		echo "openapi-lint: $(REDOCLY) lint order/openapi.json"; \
		REDOCLY_TELEMETRY=off NO_UPDATE_NOTIFIER=1 npx --prefer-offline --yes $(REDOCLY) lint --format=stylish --config order/redocly.yaml order/openapi.json; \
	else echo "openapi-lint: SKIPPED: $(REDOCLY) needs Node 20.19 or later, this machine has $$(node --version)"; fi

test: deps vet openapi-lint
	OVERSOLD_TESTBED=process OVERSOLD_REQUIRE_SERVERS=1 $(GO) test -race -count=1 -timeout 30m ./...
	# Handoff rates, which -race would distort (locking/redlock/quorum/quorum_test.go).
	OVERSOLD_TESTBED=process OVERSOLD_REQUIRE_SERVERS=1 $(GO) test -count=1 -run '^TestQuorum' -timeout 5m ./locking/redlock/quorum/
	# ZooKeeper's reaper offered 100 000 new keys a minute, which a -race
	# client cannot offer (locking/zklock/reaper_test.go).
	OVERSOLD_TESTBED=process OVERSOLD_REQUIRE_SERVERS=1 $(GO) test -count=1 -run '^TestReaperKeepsUp$$' -timeout 5m ./locking/zklock/
	OVERSOLD_TESTBED=process OVERSOLD_REQUIRE_SERVERS=1 $(GO) test -run '^$$' -bench . -benchtime 1x -timeout 5m ./bench/
	@$(MAKE) --no-print-directory test-containers
	@$(MAKE) --no-print-directory k8s-demo

# The stand-in images oversold-local/{mysql,redis,zookeeper,etcd}:latest from
# Debian packages (deploy/images/README.md), on the engine engine.sh finds or
# starts. About 3 minutes the first time, seconds after.
images: deps
	DOCKER_HOST=$$(deploy/images/engine.sh) deploy/images/build.sh

# The same servers as containers (internal/testbed, OVERSOLD_TESTBED=containers):
# the testbed's own tests, every lock's conformance suite and the lab end to
# end (the faults that signal a server: deploy/images/README.md). Official images when
# they can be pulled, else the stand-ins. Skipped, saying so, where no engine
# runs and none can be started (not root); OVERSOLD_REQUIRE_CONTAINERS=1 fails then.
CONTAINER_TESTS := ./internal/testbed/ ./locking/...
test-containers: deps
	@env=$$(deploy/images/testbed-env.sh) || { \
		echo "test-containers: SKIPPED: no container engine"; \
		[ "$$OVERSOLD_REQUIRE_CONTAINERS" != 1 ]; exit $$?; }; \
	echo "test-containers:" $$env; \
	set -x; \
	env $$env OVERSOLD_REQUIRE_SERVERS=1 $(GO) test -race -count=1 -timeout 15m $(CONTAINER_TESTS) && \
	env $$env OVERSOLD_REQUIRE_SERVERS=1 $(GO) test -count=1 -timeout 10m -run '^TestLabEndToEnd$$' ./cmd/lab/

# docker-compose.yml for real: up on a Docker engine (a private dockerd when
# none runs), every healthcheck waited for, the lab service run through the
# balancer and its invariants checked, then down -v. Builds compose v2 as a
# CLI plugin when missing, and stand-in images where no registry answers.
# Not part of make test (time): deploy/images/README.md has a run's output.
compose-demo: deps
	deploy/images/compose-demo.sh

# deploy/k8s on a real single-node Kubernetes (v1.34.4), offline: the control
# plane, kubelet and containerd as processes in a network namespace, the
# servers and orderd as pods, four lab runs through the Service (plain, a
# rollout, a refused rollout to another lock, a pod evicted), checked; the
# report in k8s-report/, and nothing of the cluster left after, whatever
# happened (deploy/k8s/README.md, "The demo on a real cluster"). Root only.
# The first run builds Kubernetes from the module proxy (about 15-20 minutes
# on 2 cores); with the Go caches kept, a few minutes.
k8s-demo: deps
	timeout --kill-after=2m 90m deploy/k8s/demo/demo.sh

# Lock benchmarks: every backend against the peer libraries on private real
# servers, three runs each (about 15 minutes on 2 cores): a ratio pairs the
# k-th run of ours with the k-th of each peer, and the table gives the median
# of the three ratios and their range.
# Prints the tables and writes them to bench/results.md; benchtable refuses
# the output of a failed run.
bench: deps
	OVERSOLD_REQUIRE_SERVERS=1 $(GO) test -run '^$$' -bench . -benchtime 3s -count 3 -timeout 60m ./bench/ | tee bench/bench.out
	$(GO) run ./bench/cmd/benchtable -o bench/results.md < bench/bench.out

# pairstream: the two commands that matter are `make demo` and `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: lock demo demo-cdc demo-patterns demo-secure demo-delivery demo-chain delivery chain bench test test-fast fault-test fault-matrix fault-matrix-long event-time setup browser podman postgres image broker stop clean generate lint

demo: setup            ## run the main job: broker, worker, generated stream, summary
	$(PY) -m tools.demo

demo-cdc: setup postgres  ## the main job with the events inserted into PostgreSQL, through Debezium on Kafka Connect, to pairs and the Delta replica
	$(PY) -m tools.demo_cdc

demo-patterns: setup   ## the pattern examples: a join of searches and clicks, an absence, three expired A; the click-through rate in Delta
	$(PY) -m tools.demo_patterns

demo-secure: setup     ## the main job on a secured broker: SASL_SSL, SCRAM-SHA-512, least-privilege ACLs
	$(PY) -m tools.demo --secure

demo-delivery: setup   ## the main job, with every pair also delivered to a stand-in order API
	$(PY) -m tools.demo --delivery

demo-chain: setup      ## the main job, with the deposit chain and enrichment of the pairs
	$(PY) -m tools.demo --chain --enrichment

chain: setup          ## the deposit chain: 20,000 deposits over 1,000 accounts, 3 kills, 1 -> 2 -> 1
	PAIRSTREAM_CHAIN_ACCOUNTS=1000 PAIRSTREAM_CHAIN_DEPOSITS=20000 PAIRSTREAM_CHAIN_KILLS=3 \
	  $(PY) -m pytest -m "broker or long" -s tests/integration/test_chain.py

delivery: setup       ## once-only delivery: 10,000 orders, every mode, 5 kills each, and 1 -> 2 -> 1
	PAIRSTREAM_DELIVERY_ORDERS=10000 PAIRSTREAM_DELIVERY_KILLS=5 $(PY) -m pytest -m "broker or long" -s \
	  tests/integration/test_delivery.py

bench: setup postgres ## the benchmark suite (about 26 minutes here), with a py-spy profile; writes docs/BENCHMARKS.md
	$(PY) -m bench --profile .run/bench-profile.txt

test: setup browser podman postgres  ## run every test (starts a broker if none is running); a test still running after 15 minutes fails
	$(PY) -m pytest --timeout 900

test-fast: setup       ## unit tests only: no broker
	$(PY) -m pytest tests/unit

fault-test: setup     ## kill -9 a worker three times while 50k records flow (PAIRSTREAM_FAULT_SEED=n)
	PAIRSTREAM_FAULT_EVENTS=50000 $(PY) -m pytest -m matrix -s -k worker_hard_kill \
	  tests/integration/test_fault_matrix.py

fault-matrix: setup   ## the six-scenario fault matrix (PAIRSTREAM_FAULT_MODE=long for 100k records), and the kill scenarios of the chain, enrichment and delivery
	$(PY) -m pytest -m matrix -s tests/integration/test_fault_matrix.py tests/integration/test_chain.py \
	  tests/integration/test_enrichment.py tests/integration/test_delivery.py

event-time: setup     ## 20,000 records through 1, 3 and 8 partitions, three ways each; a 200,000-event backlog
	PAIRSTREAM_EVENT_TIME_RECORDS=20000 $(PY) -m pytest -m "broker or long" -s \
	  tests/integration/test_event_time.py

RUNS ?= 5
SEED ?= $(shell date +%s)
fault-matrix-long: setup  ## the long matrix RUNS times in a row, seeds SEED+1.., stopping at the first failure
	@for i in $$(seq 1 $(RUNS)); do seed=$$(( $(SEED) + i )); \
	  echo "== long matrix, run $$i of $(RUNS), seed $$seed"; \
	  PAIRSTREAM_FAULT_MODE=long PAIRSTREAM_FAULT_SEED=$$seed \
	    $(PY) -m pytest -m matrix -s tests/integration/test_fault_matrix.py || exit 1; \
	done; echo "== long matrix: $(RUNS) runs in a row passed"

setup: $(STAMP)        ## create .venv, install the locked dependencies (requirements/all.txt), resolve Kafka, Kafka Connect (with Debezium) and Spark jars
	$(PY) -m tools.broker resolve
	$(PY) -m tools.connect resolve
	$(PY) -m analytics jars

$(STAMP): pyproject.toml requirements/all.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --require-hashes -r requirements/all.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

LOCK := $(VENV)/bin/uv pip compile pyproject.toml --generate-hashes --python-version 3.11 --no-header --quiet
lock: setup            ## resolve requirements/*.txt again from pyproject.toml (after changing a dependency; UPGRADE=1: newest allowed)
	$(LOCK) --extra analytics --extra dev $(if $(UPGRADE),--upgrade) -o requirements/all.txt
	$(LOCK) -c requirements/all.txt -o requirements/worker.txt
	$(LOCK) --extra analytics -c requirements/all.txt -o requirements/spark.txt

browser:               ## headless Chromium for the dashboard test (Debian's package)
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] \
	  && apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium; } \
	  || { echo "install Debian's chromium package: apt-get install chromium" >&2; exit 1; }

postgres:              ## PostgreSQL 15 (Debian's), the change data capture's source (python -m tools.postgres)
	@test -x /usr/lib/postgresql/15/bin/pg_ctl || { [ "$$(id -u)" = 0 ] \
	  && apt-get update -qq && apt-get install -y -qq --no-install-recommends postgresql-15; } \
	  || { echo "install Debian's postgresql-15 package: apt-get install postgresql-15" >&2; exit 1; }

podman:                ## podman, runc, debootstrap, catatonit (Debian's) for the container test, which skips without them
	@command -v podman >/dev/null && command -v runc >/dev/null && command -v debootstrap >/dev/null \
	  && command -v catatonit >/dev/null \
	  || { [ "$$(id -u)" = 0 ] && apt-get update -qq \
	  && apt-get install -y -qq --no-install-recommends podman runc debootstrap catatonit; } \
	  || echo "could not install podman, runc and debootstrap: the container test will skip" >&2

TARGET ?= worker
image: setup podman    ## build the worker image (TARGET=spark: the Spark jobs') on a local Debian base, made once
	$(PY) -m tools.container build --target $(TARGET)

broker: setup          ## start the local broker on 127.0.0.1:9092
	$(PY) -m tools.broker start

generate: setup        ## produce a stream: make generate ARGS="--count 5000 --rate 1000"
	$(PY) -m tools.generate $(ARGS)

stop:                  ## stop the local broker
	-$(PY) -m tools.broker stop

clean: stop            ## stop and delete all local broker and worker data
	-$(PY) -m tools.broker clean
	rm -rf .run

lint: setup
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/mypy

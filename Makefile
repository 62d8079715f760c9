# kgroup's front door. `make help` lists the targets.
SHELL := /bin/bash
PY := .venv/bin/python
VENV_STAMP := .venv/.kgroup-installed
export SPARK_LOCAL_IP := 127.0.0.1

.PHONY: help setup tools images cluster-up cluster-down cluster-status lint check unit e2e test demo demo-down bench chaos crd spark-up spark-down

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 18

setup: $(VENV_STAMP) ## create .venv/ and install everything (redis-server, pip packages)
$(VENV_STAMP): pyproject.toml constraints.txt scripts/setup.sh
	scripts/setup.sh

tools: ## build the control plane's binaries from Go modules into ~/.cache/kgroup (cached)
	@scripts/build-tools.sh >/dev/null

images: setup ## build the operator, sidecar, worker images from docker/ (buildah, cached by content); load them into the real node when it is up
	@$(PY) -m kgroup_devcluster.images load

cluster-up: setup tools ## start the local control plane (etcd, apiserver, ..., kwok); prints export KUBECONFIG=...
	@$(PY) -m kgroup_devcluster up

cluster-down: setup ## stop exactly the processes cluster-up started and remove its state
	@$(PY) -m kgroup_devcluster down

cluster-status: setup ## show the local control plane's processes
	@$(PY) -m kgroup_devcluster status

spark-up: setup ## a local Spark standalone cluster (master + worker on 127.0.0.1) for the pipeline
	@$(PY) -m kgroup_pipeline.spark_cluster up

spark-down: setup ## stop exactly the Spark processes spark-up started
	@$(PY) -m kgroup_pipeline.spark_cluster down

crd: setup ## regenerate crds/ from the pydantic models
	$(PY) -m kgroup_devtools.crdgen --write
	cp crds/kgroup.dev_consumergroups.yaml charts/kgroup/files/crds/

lint: setup ## ruff, mypy and the import contracts (pyproject.toml [tool.importlinter])
	$(PY) -m ruff check .
	$(PY) -m mypy
	.venv/bin/lint-imports

# The inner loop's tests mostly wait (on the scripted sidecar's 3 s lease, its long polls):
# four workers overlap the waits even on two cores.
check: setup tools lint ## the inner loop, under 3 minutes: lint, tests/ but Spark and the long seed sweeps (marks spark, slow), 20 simulated seeds
	$(PY) -m pytest tests -q -n 4 --dist worksteal -m "not spark and not slow"
	$(PY) -m kgroup_sim --seeds 20 --jobs 2

unit: setup ## the tests that need no cluster (Spark and the seed sweeps included)
	$(PY) -m pytest tests

e2e: setup tools ## the tests on the local control plane (brought up once per session)
	$(PY) -m pytest e2e/tests

test: setup tools lint ## every test tier: lint, unit, e2e on the local control plane, PySpark
	$(PY) -m pytest tests e2e/tests

demo: setup tools ## the main job: cluster, Redis, chart, a group of 3 -> 4 PySpark workers, events, verifier
	@$(PY) -m kgroup_devcluster.demo up

demo-down: setup ## stop what make demo started (the control plane stays: make cluster-down)
	@$(PY) -m kgroup_devcluster.demo down

bench: setup tools ## every benchmark on the local control plane; figures go to docs/bench/
	$(PY) bench/run_all.py

chaos: setup tools ## 5 minutes of faults on the full stack, then verifier + ownership audit
	$(PY) bench/chaos.py --seconds 300 --seed 1

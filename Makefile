# ds_bench: the two commands of the README's first screen, plus helpers.
#   make bench   set up (idempotent) and run the default suite: MNIST, ZeRO 0-3, deepspeed launcher
#   make test    set up (idempotent, with test extras) and run the test suite (CI's tier: not `full`)
#   make test-full  the same, with the `full` tier too (further real runs of paths already run once)
#   make test-full-only  only the `full` tier's tests (CI runs it after `make test`: .ci/run)
#   make gpu-check  the GPU tier in one command (tools/gpu_check.py): without a CUDA GPU one line and exit 0;
#                   on one H100 every GPU path in < 10 min, records + figures.md + report.html in one folder
#                   (GPU_OUT=FOLDER; default results/gpu-check-<UTC date>); docs/testing.md "The GPU tier"
#   make gpu-wheels what a lent GPU machine lacks (DeepSpeed, pydantic...), as wheels in .gpu/wheels to carry there
VENV   ?= .venv
PY     := $(VENV)/bin/python
PYTEST_ARGS ?=
# Test files run on 2 workers (pytest-xdist, a file's tests stay on one worker so its module-scoped
# runs happen once): a real run spends ~30% of its wall time in single-threaded start-up and waits
# (launcher start, imports before the ranks exist, watchdog and connect timeouts), which the other
# worker's runs fill. PYTEST_WORKERS=0 runs the suite in one process.
PYTEST_WORKERS ?= 2
# Tests marked `full` repeat, for another launcher, signal or layout, a real run another test already
# makes, or are too heavy for CI (a model above the memory cap on 8 ranks, 6 min); CI (make test)
# leaves them out to stay within 15 minutes on a 2-core machine.
PYTEST_MARK ?= not full

.PHONY: bench test test-full test-full-only setup setup-test ops clean gpu-check gpu-wheels

$(VENV)/.setup: requirements.txt pyproject.toml tools/setup.sh
	bash tools/setup.sh $(VENV)
	touch $@

# One pass installs both sets (a second pass would re-resolve the first set: ~15 s); it marks both done.
$(VENV)/.setup-test: requirements.txt requirements-test.txt pyproject.toml tools/setup.sh
	bash tools/setup.sh $(VENV) --test
	touch $(VENV)/.setup $@

setup: $(VENV)/.setup
setup-test: $(VENV)/.setup-test

# DeepSpeed compiles its CPU ops on first use; build them once, up front (cached, ~1 s when built).
ops: $(VENV)/.setup
	$(PY) -m ds_bench.machine.op_builds

bench: setup ops
	$(VENV)/bin/ds-bench bench

test: setup-test ops
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile -m "$(PYTEST_MARK)" $(PYTEST_ARGS)

test-full:
	$(MAKE) test PYTEST_MARK=""

test-full-only:
	$(MAKE) test PYTEST_MARK="full and not gpu"

# The GPU machine has no .venv and no registry (no set-up there): its own python3, which holds torch; here the venv's.
GPU_PY ?= $(if $(wildcard $(PY)),$(PY),python3)
GPU_OUT ?=

gpu-check:
	@$(GPU_PY) tools/gpu_check.py $(if $(GPU_OUT),--out $(GPU_OUT))

gpu-wheels:
	$(PY) tools/gpu_wheels.py

clean:
	rm -rf $(VENV) results .pytest_cache

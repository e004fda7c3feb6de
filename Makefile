# ds_bench: the two commands of the README's first screen, plus helpers.
#   make bench   set up (idempotent) and run the default suite: MNIST, ZeRO 0-3, deepspeed launcher
#   make test    set up (idempotent, with test extras) and run the test suite
VENV   ?= .venv
PY     := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: bench test setup setup-test ops clean

$(VENV)/.setup: requirements.txt pyproject.toml tools/setup.sh
	bash tools/setup.sh $(VENV)
	touch $@

$(VENV)/.setup-test: $(VENV)/.setup requirements-test.txt
	bash tools/setup.sh $(VENV) --test
	touch $@

setup: $(VENV)/.setup
setup-test: $(VENV)/.setup-test

# DeepSpeed compiles its CPU ops on first use; build them once, up front (cached, ~1 s when built).
ops: $(VENV)/.setup
	$(PY) -m ds_bench.machine.jit_ops

bench: setup ops
	$(VENV)/bin/ds-bench bench

test: setup-test ops
	$(PY) -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) results .pytest_cache

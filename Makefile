# Two entry points (README): `make demo` trains a tiny GPT on 4 CPU ranks, `make test` runs the
# suite. Both create .venv first (scripts/setup_env.sh, idempotent).
PY := .venv/bin/python
TORCHRUN := .venv/bin/torchrun

.PHONY: env demo test bench upstream-patch gpu-check

env:
	@bash scripts/setup_env.sh

demo: env
	@bash scripts/demo.sh

# Two pytest-xdist workers: about 0.7x the serial suite's time on 2 cores, same CPU time (the
# serial suite waits much of its time). Each test file stays on one worker, in order, so a
# module's shared launches run once (--dist loadfile). TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2

test: env
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests

# Scheduler quality/latency report, CPU training ratios, then the README table from both.
# HARDWARE_PROFILE=results/gpu/hardware_profile.json: the cost model measured on a GPU.
bench: env
	$(PY) tools/benchmark_schedulers.py --out results/scheduling \
		$(if $(UPSTREAM_MEGATRON),--upstream-megatron $(UPSTREAM_MEGATRON)) \
		$(if $(HARDWARE_PROFILE),--hardware-profile $(HARDWARE_PROFILE))
	$(PY) tools/benchmark_training.py --out results/training
	$(PY) tools/update_readme_tables.py

# Our scheduler as a patch series for a Megatron-LM dev checkout, applied and tested in scratch
# clones (README "Our scheduler in Megatron-LM"); the checkout itself is only read.
upstream-patch: env
	$(PY) tools/upstream_patch.py --megatron $(UPSTREAM_MEGATRON) --report results/upstream_patch

# The GPU check (tools/gpu_check.py, README "GPU"): run on a GPU machine with its own CUDA torch
# (no .venv; the wheels in .whl/ whose package is missing are installed). GPU_CHECK_ARGS passes
# options, e.g. GPU_CHECK_ARGS="--parts benchmark --sizes 1.3b,2.8b".
gpu-check:
	python3 tools/gpu_check.py $(GPU_CHECK_ARGS)

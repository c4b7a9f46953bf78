# Two entry points (README): `make demo` trains a tiny GPT on 4 CPU ranks, `make test` runs the
# suite. Both create .venv first (scripts/setup_env.sh, idempotent).
PY := .venv/bin/python
TORCHRUN := .venv/bin/torchrun

.PHONY: env demo test bench

env:
	@bash scripts/setup_env.sh

demo: env
	@bash scripts/demo.sh

test: env
	$(PY) -m pytest -q tests

# Scheduler quality/latency report, CPU training ratios, then the README table from both.
bench: env
	$(PY) tools/benchmark_schedulers.py --out results/scheduling \
		$(if $(UPSTREAM_MEGATRON),--upstream-megatron $(UPSTREAM_MEGATRON))
	$(PY) tools/benchmark_training.py --out results/training
	$(PY) tools/update_readme_tables.py

"""The multi-rank test harness (kept out of the installed library).

* :mod:`tests.harness.multirank`: ``run_distributed`` launches N gloo ranks with a deadline and
  reaps every child;
* :mod:`tests.harness.training_runs`: the real training path inside those ranks
  (``train_on_this_rank``, ``TINY_GPT_ARGS``).

Besides the tests, tools/benchmark_training.py launches its CPU training runs through it (the
dev environment makes ``tests`` importable, see scripts/setup_env.sh).
"""

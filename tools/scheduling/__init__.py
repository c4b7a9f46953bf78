"""Code the scheduling tools share (benchmark workloads and report, simulator core, our
re-implementation of upstream's schedulers from prose). Never imported by the library:
``megatron/`` holds only what training runs; tools/schedule_sim.py and
tools/benchmark_schedulers.py import these modules as ``tools.scheduling.*``."""

"""Run upstream Megatron-LM's own packing schedulers from a local checkout (benchmark only).

    from tools.upstream_schedulers import run_upstream
    results = run_upstream("/path/to/Megatron-LM", jobs)

Nothing of upstream is copied here: a worker subprocess (this file with ``--worker``) imports
upstream's pure scheduling classes straight from the checkout's files and runs them on our
inputs, unmodified:

* ``DefaultDynamicCPScheduler.get_groups_and_subsamples`` (megatron/core/datasets/
  data_schedule.py, with ``next_hdp_group_packing_aware`` from data_schedule_utils.py):
  upstream's ``default_dynamic_cp``;
* ``DpBalancedScheduler.get_groups_and_subsamples`` (same file): upstream's ``dp_balanced``;
* ``LptDynamicCPScheduler.get_groups_and_subsamples`` (same file, in a checkout patched by
  tools/upstream_patch.py): our scheduler as the series carries it, for the reproduction.

Import handling (documented stubs, nothing else): the worker runs in its own process so that
``megatron`` means upstream's package there, not ours or the installed megatron-core. The two
files import torch (real, CPU) and, at module level, names the scheduling functions never use
(``parallel_state``, Transformer Engine's ``get_thd_partitioned_indices``, ``RerunDataIterator``,
the packed-sequence helpers, ``BalancedCPScheduler``, ``ProcessGroupCollection``,
``mtp_on_this_rank``); the worker registers placeholder modules for exactly those (any public
attribute is a dummy class) and loads the two files by path, so neither upstream's package
``__init__`` files nor Transformer Engine / CUDA are needed.

Schedules come back as upstream returns them (per micro-batch, per DPxCP rank, sample ids) and
are evaluated by ``evaluate_upstream`` with our cost model and padding rule: a sample's CP size
is the number of ranks that hold it in its micro-batch, a rank's time is the sum of its samples'
``t(padded L, c)`` plus its group latency ``d (c - 1)``; every sample must appear in exactly one
micro-batch. Upstream pads dynamic-CP samples to a multiple of 2 * DP * CP, which would only make
it slower: our rule is the kinder choice.
"""

from __future__ import annotations

if not __package__:  # run as `python tools/X.py`: the repository root on sys.path
    import _repo_root  # noqa: F401

import importlib.util
import json
import os
import subprocess
import sys
import time
import types

UTILS_FILE = os.path.join("megatron", "core", "datasets", "data_schedule_utils.py")
SCHEDULE_FILE = os.path.join("megatron", "core", "datasets", "data_schedule.py")
STUBBED_MODULES = ("megatron.core.parallel_state", "megatron.core.extensions.transformer_engine",
                   "megatron.core.rerun_state_machine", "megatron.core.packed_seq_params",
                   "megatron.core.pipeline_parallel.hybrid_cp_schedule",
                   "megatron.core.process_groups_config",
                   "megatron.core.transformer.multi_token_prediction")
PACKAGES = ("megatron", "megatron.core", "megatron.core.datasets", "megatron.core.extensions",
            "megatron.core.pipeline_parallel", "megatron.core.transformer")
WORKER_TIMEOUT_S = 3600
SCHEDULER_CLASSES = ("DefaultDynamicCPScheduler", "DpBalancedScheduler")
# Job kind -> class of data_schedule.py ("lpt": only in a checkout the upstream patch patched).
JOB_CLASSES = {"dynamic": "DefaultDynamicCPScheduler", "dp_balanced": "DpBalancedScheduler",
               "lpt": "LptDynamicCPScheduler"}
KNOWN_GOOD_COMMIT = "d48bd6be0a85"  # the dev commit results/scheduling/REPORT.md ran


# --- parent side ---------------------------------------------------------------------------

def upstream_commit(path: str) -> str:
    """The checkout's commit hash (or 'unknown' if it is not a git work tree)."""
    try:
        return subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def check_checkout(path: str) -> None:
    """Raises ValueError naming the missing file or class if ``path`` is not a usable
    checkout (newer Megatron-LM dev removed DefaultDynamicCPScheduler, so a checkout must be
    from when it existed)."""
    for relative in (UTILS_FILE, SCHEDULE_FILE):
        if not os.path.isfile(os.path.join(path, relative)):
            raise ValueError(f"{os.path.join(path, relative)} not found: --upstream-megatron "
                             "must point at a Megatron-LM checkout that has it")
    with open(os.path.join(path, SCHEDULE_FILE), encoding="utf-8") as handle:
        source = handle.read()
    for name in SCHEDULER_CLASSES:
        if f"class {name}" not in source:
            raise ValueError(f"{os.path.join(path, SCHEDULE_FILE)} has no class {name}: "
                             f"--upstream-megatron needs a Megatron-LM checkout that has it "
                             f"(e.g. commit {KNOWN_GOOD_COMMIT})")


def run_upstream(path: str, jobs: list[dict]) -> list[dict]:
    """Runs ``jobs`` in one worker process. A job: {"scheduler": "dynamic"|"dp_balanced"|"lpt",
    "lengths", "dp_size", "cp_size", "budget", "repeats"} (and for "lpt" the cost model's
    "cost" coefficients). Returns per job {"microbatches":
    [[[ids] per rank] per micro-batch], "ms": best wall ms} or {"error": message}."""
    check_checkout(path)
    result = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", path],
                            input=json.dumps(jobs), capture_output=True, text=True,
                            timeout=WORKER_TIMEOUT_S)
    if result.returncode != 0:
        tail = result.stderr.strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"upstream worker failed (exit {result.returncode}): {tail[0]}")
    return json.loads(result.stdout)


def evaluate_upstream(microbatches: list, lengths: list[int], cost, sp_factor: int = 1) -> dict:
    """Critical path of an upstream schedule under our cost model (module docstring) and the
    most padded tokens any rank holds in a micro-batch (to compare with the budget)."""
    from megatron.varlen.scheduling.problem import padded_length

    seen = [0] * len(lengths)
    path, max_tokens = 0.0, 0
    for ranks in microbatches:
        holders: dict[int, int] = {}
        for ids in ranks:
            for seq in set(ids):
                holders[seq] = holders.get(seq, 0) + 1
        for seq in holders:
            seen[seq] += 1
        level = 0.0
        for ids in ranks:
            if not ids:
                continue
            sizes = [holders[seq] for seq in ids]
            max_tokens = max(max_tokens, sum(padded_length(lengths[seq], size, sp_factor) // size
                                             for seq, size in zip(ids, sizes)))
            time_ = sum(cost.time(padded_length(lengths[seq], size, sp_factor), size)
                        for seq, size in zip(ids, sizes))
            level = max(level, time_ + cost.group_latency(max(sizes)))
        path += level
    missing = [seq for seq, count in enumerate(seen) if count != 1]
    if missing:
        raise AssertionError(f"upstream schedule holds sample {missing[0]} "
                             f"{seen[missing[0]]} times")
    return {"critical_path": path, "num_microbatches": len(microbatches),
            "max_rank_tokens": max_tokens}


# --- worker side ---------------------------------------------------------------------------

class _Placeholder:
    """Stands in for any upstream name the scheduling functions do not use."""

    def __init__(self, *args, **kwargs) -> None:
        pass


def _placeholder_module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)

    def attribute(key: str) -> type:  # PEP 562: any public name imports as a placeholder
        if key.startswith("__"):
            raise AttributeError(key)  # dunders stay absent (inspect, pickle look for them)
        return _Placeholder

    module.__getattr__ = attribute
    return module


def _load(name: str, path: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _import_upstream(checkout: str) -> types.ModuleType:
    """data_schedule.py loaded from the checkout's files (its scheduler classes)."""
    for name in PACKAGES:
        package = types.ModuleType(name)
        package.__path__ = []  # a package, but nothing is imported through it by path
        sys.modules[name] = package
    # Subpackages of megatron/core/datasets (the patched tree's lpt_dynamic_cp) import from the
    # checkout's files; its own __init__.py still does not run.
    sys.modules["megatron.core.datasets"].__path__ = [os.path.dirname(
        os.path.join(checkout, SCHEDULE_FILE))]
    for name in STUBBED_MODULES:
        sys.modules[name] = _placeholder_module(name)
    sys.modules["megatron.core"].parallel_state = sys.modules["megatron.core.parallel_state"]
    _load("megatron.core.datasets.data_schedule_utils", os.path.join(checkout, UTILS_FILE))
    return _load("megatron.core.datasets.data_schedule", os.path.join(checkout, SCHEDULE_FILE))


def _run_job(job: dict, schedule: types.ModuleType) -> dict:
    scheduler_class = getattr(schedule, JOB_CLASSES[job["scheduler"]])
    pairs = list(enumerate(job["lengths"]))
    num_ranks = job["dp_size"] * job["cp_size"]
    args = (job["budget"], job["cp_size"], job["dp_size"], None)
    kwargs = {}
    if job["scheduler"] != "dp_balanced":
        kwargs["min_cp_size"] = job.get("min_cp_size", 1)
    if job["scheduler"] == "lpt":
        kwargs["cost_coefficients"] = job["cost"]
    best, microbatches = float("inf"), None
    for _ in range(job.get("repeats", 1)):
        start = time.perf_counter()
        scheduler = scheduler_class(*args, **kwargs)
        groups = scheduler.get_groups_and_subsamples(list(pairs))
        best = min(best, 1000.0 * (time.perf_counter() - start))
        microbatches = [[[int(seq) for seq in ids] for ids in ranks]
                        + [[]] * (num_ranks - len(ranks)) for ranks in groups]
    return {"microbatches": microbatches, "ms": best}


def _worker(checkout: str) -> int:
    # No sys.path handling: every ``megatron.*`` name the two files import resolves through the
    # packages and stubs _import_upstream registers in sys.modules first, so neither our
    # package nor the installed megatron-core can stand in for upstream's.
    schedule = _import_upstream(checkout)
    out = []
    for job in json.load(sys.stdin):
        try:
            out.append(_run_job(job, schedule))
        except Exception as error:  # upstream's own asserts: report, do not stop the run
            out.append({"error": f"{type(error).__name__}: {error}"})
    json.dump(out, sys.stdout)
    return 0


USAGE = ("usage: upstream_schedulers.py --worker MEGATRON_LM_CHECKOUT (started by "
         "tools/benchmark_schedulers.py --upstream-megatron; jobs as JSON on stdin)")

if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        sys.exit(_worker(sys.argv[2]))
    if sys.argv[1:] in (["-h"], ["--help"]):
        print(USAGE)
        sys.exit(0)
    print(USAGE, file=sys.stderr)
    sys.exit(2)

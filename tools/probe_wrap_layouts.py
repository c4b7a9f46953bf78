"""Probe the megatron.wrap facade's flows over layouts against the single-rank run.

    python tools/probe_wrap_layouts.py LAYOUT [LAYOUT ...] [--flows gpt_sft test_gpt ...]

Each layout runs ``tests/harness/wrap_layouts.facade_steps`` (explicit batches, every flow:
train() steps and one evaluate()) and is compared with the same call on one rank: every step's
loss and grad norm and the evaluated loss within ``RTOL`` relative. One line per (layout, flow):
equal / different (largest gap, where) / crashed (last line).
"""

from __future__ import annotations

if not __package__:  # run as `python tools/X.py`: the repository root on sys.path
    import _repo_root  # noqa: F401

import argparse

from tests.harness.multirank import DistributedTestError, reap_runs_on_sigterm, run_distributed
from tests.harness.wrap_layouts import FLOWS, facade_steps

RTOL = 1e-5
LAUNCH_TIMEOUT_S = 400
DYNAMIC = {"dynamic_context_parallel": True, "max_seqlen_per_dp_cp_rank": 32}
# name: (parallel section, world size)
LAYOUTS = {
    "single": ({}, 1),
    "dp2": ({}, 2),
    "tp2": ({"tensor_model_parallel_size": 2}, 2),
    "tp2_sp": ({"tensor_model_parallel_size": 2, "sequence_parallel": True}, 2),
    "pp2": ({"pipeline_model_parallel_size": 2}, 2),
    "cp2": ({"context_parallel_size": 2}, 2),
    "dyn_cp2": ({**DYNAMIC, "context_parallel_size": 2}, 2),
    "dyn_dp4": ({**DYNAMIC, "max_seqlen_per_dp_cp_rank": 16}, 4),
    "pp2_dyn_dp2": ({**DYNAMIC, "pipeline_model_parallel_size": 2}, 4),
    "tp2_dyn_cp2": ({**DYNAMIC, "tensor_model_parallel_size": 2, "context_parallel_size": 2}, 4),
}


def gaps(got: dict, ref: dict) -> tuple[float, str]:
    """The largest relative gap between two flows' results, and where."""
    worst, where = 0.0, ""
    pairs = [(f"loss step {i + 1}", a, b) for i, (a, b) in enumerate(zip(got["losses"],
                                                                        ref["losses"]))]
    pairs += [(f"grad norm step {i + 1}", a, b)
              for i, (a, b) in enumerate(zip(got["grad_norms"], ref["grad_norms"]))]
    pairs.append(("evaluate", got["evaluated"], ref["evaluated"]))
    for name, a, b in pairs:
        gap = abs(a - b) / abs(b)
        if gap > worst:
            worst, where = gap, f"{name}: {a:.8g} vs {b:.8g}"
    return worst, where


def run_layout(layout: str, flows: tuple[str, ...]) -> list[dict]:
    """Every rank's results (all ranks must report the same numbers)."""
    parallel, world = LAYOUTS[layout]
    return run_distributed(facade_steps, world, args=(parallel, flows),
                           timeout_s=LAUNCH_TIMEOUT_S)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("layouts", nargs="+", choices=sorted(LAYOUTS))
    parser.add_argument("--flows", nargs="+", default=list(FLOWS), choices=sorted(FLOWS))
    options = parser.parse_args()
    reap_runs_on_sigterm()  # a killed probe leaves no rank behind
    flows = tuple(options.flows)
    reference = run_layout("single", flows)[0]
    for layout in options.layouts:
        try:
            ranks = run_layout(layout, flows)
        except DistributedTestError as err:
            print(f"{layout:14s} all flows     crashed   {str(err).strip().splitlines()[-1]}")
            continue
        for flow in flows:
            worst, where = max(gaps(rank[flow], reference[flow]) for rank in ranks)
            verdict = "equal" if worst <= RTOL else "different"
            print(f"{layout:14s} {flow:20s} {verdict:9s} {worst:.2e} {where}", flush=True)


if __name__ == "__main__":
    main()

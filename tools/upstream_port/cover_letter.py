"""The series' cover letter: what it adds and why by flag, the measured comparison (from the
benchmark's results.json, never typed in), the design in brief, the known differences."""

from __future__ import annotations

import statistics
import textwrap

from tools.upstream_port.benchmark_rows import compared_rows
from tools.upstream_port.sample_id_groups import SCHEDULER_NAME

SUBJECT = (f"Add {SCHEDULER_NAME}: a dynamic-CP packing scheduler balanced by a cost model "
           "(opt-in)")
WIDTH = 72  # e-mail body width
LATENCY_RANKS = ("8", "64")  # where upstream's default_dynamic_cp was timed

SUMMARY = f"""\
This series adds {SCHEDULER_NAME}, a sequence packing scheduler for dynamic context
parallelism, beside default_dynamic_cp. It is selected by a flag:

    --dynamic-context-parallel --sequence-packing-scheduler {SCHEDULER_NAME}

(config: sequence_packing_scheduler='{SCHEDULER_NAME}'), and default_dynamic_cp stays the
default. Why a flag rather than a replacement: reviewers and users can compare both on their own
batches in one tree; default_dynamic_cp's tests pin its exact groups and stay as they are; and
the cost model's default rates (H100 NVLink) should be checked on other hardware before the
default changes, which is then a one-line follow-up.

Patch 1 adds the scheduling package megatron/core/datasets/{SCHEDULER_NAME}/ (pure Python and
numpy; generated from megatron-varlen, see its __init__.py), patch 2 the LptDynamicCPScheduler
class in data_schedule.py behind the existing scheduler interface (get_groups_and_subsamples,
run() and the data path unchanged), patch 3 the config field, flag choice and checks. Each
patch brings its CPU unit tests."""

DESIGN = """\
Design in brief. Every sample gets a CP group size of its own, at least the smallest whose
padded tokens per rank fit max_seqlen_per_dp_cp_rank. One microbatch at a time: the longest
queued samples open groups and then go, longest first, to the group where they end lowest
(LPT); the room left below the slowest group is filled with the longest queued samples that fit
its time and token room (best fit); free ranks go to groups that grow without slowing the
microbatch; where ranks idle beside a long sample, the microbatch is also built with larger
groups for it and the variant with the least excess over its work is kept. Light microbatches
are dissolved into earlier ones, small batches get exchanges between groups, and the static
dp_balanced schedule is kept instead whenever it is shorter. The quantity balanced is an
estimated per-rank time, t(P, c) = (a P^2 + b P) / c + g P (c - 1) / c per sample plus a ring
latency d (c - 1) per group and microbatch, from the model's hidden size and query groups;
budgets count padded tokens. Every sort has a total order (length, then id): schedules are
deterministic."""

DIFFERENCES = [
    "Every DPxCP rank packs at least one sample in every microbatch, as the data path needs: "
    "where our scheduler would leave a rank idle (work there would slow the microbatch), a "
    "group is grown onto it, which can lengthen that microbatch slightly.",
    "DPxCP sizes: any size whose groups parallel_state creates (powers of two and the whole "
    "DPxCP group), e.g. 6, 12, 24 ranks; a size that needs other groups (18 ranks need groups "
    "of 6) is refused at construction in one line. default_dynamic_cp assumes powers of two.",
    "The budget counts padded tokens (the lengths the data path passes are already padded by "
    "the dataset), so no rank ever holds more than max_seqlen_per_dp_cp_rank.",
    "thd_max_packed_sequences (a cap on samples per microbatch) is not kept and is refused.",
    "Only the VPP multiple is enforced on the microbatch count (as default_dynamic_cp); "
    "megatron-varlen also reaches the pipeline depth, which this interface does not pass.",
    "In megatron-varlen the FLOP sums of a batch are exact integers and CP size 1 needs no "
    "process group; this series leaves run(), its float32 sums and parallel_state's groups as "
    "they are.",
    "The cost model's rates are not yet a flag (LptDynamicCPScheduler takes "
    "cost_coefficients=).",
]


def _wrap(text: str) -> str:
    """Paragraphs re-wrapped to the e-mail width; indented (command) paragraphs kept."""
    paragraphs = text.split("\n\n")
    return "\n\n".join(paragraph if paragraph.startswith("    ")
                        else "\n".join(textwrap.wrap(" ".join(paragraph.split()), WIDTH))
                        for paragraph in paragraphs)


def _comparison_table(results: dict) -> list[str]:
    rows = compared_rows(results)
    width = max(len(row.label) for row in rows)
    lines = [f"  {'configuration':<{width}} {'lpt/LB3':>7} {'dflt/LB3':>8} {'lpt/dflt':>8} "
             f"{'dflt tok/budget':>15}"]
    for row in rows:
        lines.append(f"  {row.label:<{width}} {row.ours / row.bound:7.3f} "
                     f"{row.theirs / row.bound:8.3f} {row.ours / row.theirs:8.3f} "
                     f"{row.their_max_tokens / row.budget:15.3f}")
    return lines


def _headline(results: dict) -> list[str]:
    rows = compared_rows(results)
    default_cost = [row.ours / row.theirs for row in rows if row.section != "attention_only"]
    attention = [row.ours / row.theirs for row in rows if row.section == "attention_only"]
    over = [row.their_max_tokens / row.budget for row in rows if row.their_max_tokens > row.budget]
    text = (f"Critical path of {SCHEDULER_NAME} / default_dynamic_cp's: median "
            f"{statistics.median(default_cost):.3f}x over {len(default_cost)} configurations "
            f"with the default cost (range {min(default_cost):.3f}x .. {max(default_cost):.3f}x)")
    if attention:
        text += (f"; median {statistics.median(attention):.3f}x over {len(attention)} with an "
                 "attention-only cost (upstream's L^2/c)")
    budget = (f"default_dynamic_cp's groups exceed the budget after padding in {len(over)} of "
              f"{len(rows)} configurations (at most {max(over):.3f}x: its packing counts "
              "unpadded tokens); {SCHEDULER_NAME}'s never do (every schedule is validated)."
              if over else "Neither scheduler exceeds the budget after padding.")
    return [_wrap(text + "."), "", _wrap(budget.replace("{SCHEDULER_NAME}", SCHEDULER_NAME))]


def _latency_lines(results: dict) -> list[str]:
    latency = results.get("latency", {})
    lines = [f"  {'ranks':>5} {'sequences':>9} {SCHEDULER_NAME + ' CPU ms':>20} "
             f"{'default_dynamic_cp wall ms':>27}"]
    for ranks in LATENCY_RANKS:
        values = latency.get(ranks, {})
        if "upstream_dynamic_cp (wall)" in values:
            lines.append(f"  {ranks:>5} {values['num_sequences']:>9} "
                         f"{values['default_dynamic_cp']:>20.1f} "
                         f"{values['upstream_dynamic_cp (wall)']:>27.1f}")
    return lines


def cover_letter_body(results: dict, source: str, base: str) -> str:
    """The blurb of 0000-cover-letter.patch (``source``: the megatron-varlen commit the series
    is generated from; ``base``: the Megatron-LM commit it applies to)."""
    upstream = results["upstream"]["commit"][:12]
    method = (f"Measured by megatron-varlen's tools/benchmark_schedulers.py on the same batches: "
              f"default_dynamic_cp run unmodified from Megatron-LM {upstream}, both schedules "
              f"evaluated with the same cost model and padding rule, critical path = sum over "
              f"microbatches of the slowest rank's estimated time, LB3 = a lower bound on it "
              f"(smaller is better everywhere; tok/budget = most padded tokens on a rank over "
              f"max_seqlen_per_dp_cp_rank).")
    parts = [_wrap(SUMMARY), "", _wrap(method), "", *_comparison_table(results), "",
             *_headline(results),
             "", "Scheduler latency (64 samples per rank, one process, CPU):",
             *_latency_lines(results), "", _wrap(DESIGN), "", "Known differences:", ""]
    for item in DIFFERENCES:
        parts += textwrap.wrap(item, WIDTH, initial_indent="- ", subsequent_indent="  ")
    parts += ["", _wrap(f"Generated by megatron-varlen's tools/upstream_patch.py from {source} "
                        f"against {base[:12]}; it also applies the series to a scratch clone "
                        f"and runs upstream's scheduler and packing tests before and after."), ""]
    return "\n".join(parts)

"""tools/host_work.py on CPU (tiny GPT): the tool runs, and the host work of a step's forward and
backward does not grow with the number of sequences in a pack (its data path's grows only
where the dataset builds each sample).

One run of the tool (subprocess, as a user runs it): packs of 4 and of 64 sequences with the
same 256 tokens, packed and padded, with one MTP layer, one counted step each after one warm-up
step (no timed steps: the CPU kernel twin's per-sequence loop makes a 64-sequence step cost
seconds, and no test reads the times). Counting is the
reference: the same model, the same tokens, so every (phase, op, site) count of the forward and
the backward must be equal between the two packs, except at the sites in :data:`KNOWN_GROWTH`
(none). The same counts show what must not happen at all (an index the plan does not need, a
copy of megatron-core's V before the kernel).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
FEW, MANY = 4, 64
# Sites whose forward/backward work grows with the sequences of a pack, and why: none since
# RoPE comes from one table per micro-batch (attention/packed_rope.py; megatron-core's THD RoPE
# sliced q and k per sequence in every layer).
KNOWN_GROWTH: set[str] = set()
# Files whose data-phase work (building a step's micro-batches) grows with the samples of a
# packed step, and why: the SFT/mock dataset builds each sample it reads, in this process.
# Rerouting, scheduling and packing hold a fixed number of operator calls.
KNOWN_DATA_GROWTH = {"megatron/varlen_training/datasets/sample.py"}
# Counts do not depend on torch's threads (the same counts either way); time does: the tiny
# model's operations are too small to share out, and on every core of the loaded 2-core
# machine the run took 31-34 s against 16 s on one thread, side by side.
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def tool_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("host_work") / "counts.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "host_work.py"), "--sequences", f"{FEW},{MANY}",
         "--tokens", "256", "--warmup", "1", "--timed", "0", "--top", "5", "--json", str(out),
         "--extra-args", "--mtp-num-layers 1"],
        capture_output=True, text=True, timeout=300, cwd=REPO, env=ONE_THREAD)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = {name: {tuple(row[:3]): row[3] for row in result["counts"]}
              for name, result in json.loads(out.read_text()).items()}
    return proc.stdout, counts


def _model_counts(counts: dict) -> dict:
    return {key: n for key, n in counts.items() if key[0] in ("forward", "backward")}


def test_the_tool_prints_the_summary_and_the_growth_tables(tool_run):
    stdout, counts = tool_run
    assert set(counts) == {f"{c}-{n}" for c in ("packed", "padded") for n in (FEW, MANY)}
    for line in ("configuration", f"packed-{FEW}", f"padded-{MANY}",
                 f"--- growth: packed-{FEW} -> packed-{MANY}", "megatron/"):
        assert line in stdout, stdout[-2000:]
    for name, table in counts.items():  # every phase counted in every configuration
        assert {phase for phase, _, _ in table} == {"data", "forward", "backward", "step"}, name


@pytest.mark.parametrize("config", ["packed", "padded"])
def test_forward_and_backward_work_does_not_grow_with_the_sequences(tool_run, config):
    _, counts = tool_run
    few, many = (_model_counts(counts[f"{config}-{n}"]) for n in (FEW, MANY))
    grown = sorted((key, few.get(key, 0), many.get(key, 0)) for key in set(few) | set(many)
                   if few.get(key, 0) != many.get(key, 0) and key[2] not in KNOWN_GROWTH
                   and not key[2].startswith(tuple(f"{site}:" for site in KNOWN_GROWTH)))
    assert grown == [], grown


def test_packed_data_path_work_grows_only_where_samples_are_read(tool_run):
    _, counts = tool_run
    few, many = ({key: n for key, n in counts[f"packed-{n}"].items() if key[0] == "data"}
                 for n in (FEW, MANY))
    grown = {key[2].rsplit(":", 1)[0] for key in set(few) | set(many)
             if few.get(key, 0) != many.get(key, 0)}
    assert grown - KNOWN_DATA_GROWTH == set(), sorted(grown)


def test_the_attention_plan_builds_no_index_for_a_pack_without_padding(tool_run):
    # The mock SFT packs on one rank carry no padding: the plan needs no index at all (it was
    # two repeat_interleave per index and a torch.equal against arange per micro-batch).
    _, counts = tool_run
    for n in (FEW, MANY):
        ops = {op for (phase, op, site) in counts[f"packed-{n}"]
               if phase in ("forward", "backward") and "attention_plan.py" in site}
        assert not ops & {"repeat_interleave", "equal", "arange"}, ops


def test_the_kernel_twin_counts_as_one_call_each_way(tool_run):
    _, counts = tool_run
    table = counts[f"packed-{MANY}"]
    kernel = {phase: n for (phase, op, _), n in table.items() if op.startswith("varlen_attn")}
    assert kernel == {"forward": 3, "backward": 3}  # 2 layers and the MTP layer, one micro-batch

"""``--dist-ckpt-optim-fully-reshardable``: distributed-optimizer state saved in megatron-core's
``fully_reshardable`` format resumes, Adam moments and all, at another model-parallel layout.
2 iterations + save at layout A + load at layout B + 2 iterations == the uninterrupted 4 at
layout B (lm loss and grad norm, balancing losses for MoE, 1e-5 relative: float32 rounding;
iteration 4's numbers follow the Adam moments loaded, not only the weights; every layout starts
from the same weights: layout-invariant initialisation):

- dense, A = DP 4 (TP 1, PP 1, one gradient bucket) -> B = TP 2 x DP 2 with small gradient
  buckets (``--overlap-grad-reduce --ddp-bucket-size``: the ``dp_reshardable`` state is stored
  per bucket, this one is not), and -> B = PP 2 with two virtual stages per rank x DP 2 (the
  pipeline and the virtual pipeline change at once);
- MoE, A = EP 4 x expert-TP 1 (saved with ``--distrib-optim-fully-reshardable-mem-efficient``:
  gathered over gloo to data-parallel rank 0) -> B = EP 2 x expert-TP 2.

The same resumes from the default ``dp_reshardable`` format stay refused in one line naming
the flag (test_moe_checkpoint.py, test_moe_etp_resume.py, test_resume_consistency.py).

Saves now set Megatron-LM's ``chained_optim_avoid_prefix``, which changes the keys of an EP > 1
plain-optimizer checkpoint; one saved as before (no stored metadata, ``chained_<i>.`` keys)
still resumes: EP 2 x expert-TP 1 -> EP 2 x expert-TP 2 == the straight run there; at EP 1
(one optimizer, no prefixes) its optimizer state is refused in one line.

One 4-rank launch (every run in the same processes).
"""

import contextlib
import json
import logging

import pytest
from torch.distributed.checkpoint import FileSystemReader

from megatron.varlen_training.checkpoint import save as checkpoint_save
from megatron.varlen_training.checkpoint import sharding as checkpoint_sharding
from megatron.varlen_training.checkpoint.sharding import FULLY_RESHARDABLE, SHARDING_TYPE_KEY
from megatron.varlen_training.log import get_logger
from megatron.varlen_training.resume.run_args_keys import RUN_ARGS_FILENAME
from tests.harness.multirank import run_distributed
from tests.unit_tests.varlen_training.test_moe_checkpoint import (
    BASE as MOE_BASE, DISTRIBUTED, EP1, EP2, EP4, RTOL, WORLD, _metrics_or_refusal, _save_at_2,
    freeze_what_is_alive,
)
from tools.probe_combinations import LAYOUTS, RESUME_ITERS, cell_argv

LAUNCH_TIMEOUT_S = 420  # eleven tiny runs; 4 ranks share 2 cores on the CI machine
RESHARDABLE = ["--dist-ckpt-optim-fully-reshardable"]
MEM_EFFICIENT = ["--distrib-optim-fully-reshardable-mem-efficient"]
ETP1 = ["--expert-tensor-parallel-size", "1"]
ETP2 = ["--expert-tensor-parallel-size", "2"]
# Buckets of at most 2000 parameters instead of one per buffer (the tiny model has ~40k).
SMALL_BUCKETS = ["--overlap-grad-reduce", "--ddp-bucket-size", "2000"]
DENSE_METRICS = ("lm_loss", "grad_norm")
MOE_METRICS = ("lm_loss", "seq_load_balancing_loss", "z_loss", "grad_norm")


def _dense(layout: str) -> list[str]:
    """The probe's dense distributed-optimizer cell, unpacked, on 4 ranks."""
    argv, _, _ = cell_argv("dist_opt", "u_single", "none")
    return argv + LAYOUTS[layout][0][len(LAYOUTS["u_single"][0]):] + RESHARDABLE + [
        "--train-iters", str(RESUME_ITERS), "--lr-decay-iters", str(RESUME_ITERS)]


@contextlib.contextmanager
def _saved_as_before():
    """Saves as this fork did before the metadata was stored: every save built the optimizer
    state with the dp_reshardable type (chained_<i>. keys with EP > 1) and stored none."""
    real_metadata = checkpoint_sharding.save_metadata
    real_module = checkpoint_save.dist_checkpointing

    class _OldSaver:
        @staticmethod
        def save(state, path, *strategies, content_metadata=None, **options):
            real_module.save(state, path, *strategies, **options)

        def __getattr__(self, name):
            return getattr(real_module, name)

    checkpoint_sharding.save_metadata = lambda run: dict(checkpoint_sharding.LEGACY_METADATA)
    checkpoint_save.dist_checkpointing = _OldSaver()
    try:
        yield
    finally:
        checkpoint_sharding.save_metadata = real_metadata
        checkpoint_save.dist_checkpointing = real_module


class _Lines(logging.Handler):
    """The lines this fork logs (Megatron-LM's, e.g. at a save and a load)."""

    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _runs_on_this_rank(runs: dict[str, list[str]]) -> dict[str, dict]:
    freeze_what_is_alive()
    out, lines = {}, _Lines()
    get_logger().addHandler(lines)
    try:
        for name, argv in runs.items():  # in order
            with _saved_as_before() if name.startswith("save_old") else contextlib.nullcontext():
                out[name] = _metrics_or_refusal(argv)
    finally:
        get_logger().removeHandler(lines)
    out["lines"] = lines.lines
    return out


def _planned_runs(folder) -> dict[str, list[str]]:
    """Saves at iteration 2, the straight runs, then the loads of those saves (in this order)."""
    dense, moe, old = folder / "dense_dp4", folder / "moe_ep4", folder / "old_moe_ep2"
    moe_b = MOE_BASE + DISTRIBUTED + RESHARDABLE + EP2 + ETP2
    return {
        "save_old_moe_ep2": MOE_BASE + EP2 + ETP1 + _save_at_2(old),  # the plain optimizer
        "save_dense_dp4": _dense("u_single") + _save_at_2(dense),
        "save_moe_ep4": MOE_BASE + DISTRIBUTED + RESHARDABLE + MEM_EFFICIENT + EP4 + ETP1
        + _save_at_2(moe),
        "straight_dense_tp2": _dense("u_tp2") + SMALL_BUCKETS,
        "straight_dense_vpp2": _dense("u_vpp2"),
        "straight_moe_ep2_etp2": moe_b,
        "dense_dp4_to_tp2": _dense("u_tp2") + SMALL_BUCKETS + ["--load", str(dense)],
        "dense_dp4_to_vpp2": _dense("u_vpp2") + ["--load", str(dense)],
        "moe_ep4_to_ep2_etp2": moe_b + ["--load", str(moe)],
        "old_moe_ep2_to_etp2": MOE_BASE + EP2 + ETP2 + ["--load", str(old)],
        "old_moe_ep2_to_ep1": MOE_BASE + EP1 + ["--load", str(old)],
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    """Each run's result on the last rank that owns the loss (rank 0's for a refusal)."""
    folder = tmp_path_factory.mktemp("fully_reshardable")
    planned = _planned_runs(folder)
    per_rank = run_distributed(_runs_on_this_rank, WORLD, args=(planned,),
                               timeout_s=LAUNCH_TIMEOUT_S)
    results = {name: next((ranks[name] for ranks in reversed(per_rank)
                           if ranks[name]["owns_loss"]), per_rank[0][name]) for name in planned}
    results["folder"] = folder
    results["rank 0 lines"] = per_rank[0]["lines"]
    return results


@pytest.mark.parametrize("saved, resumed, straight, metrics", [
    ("save_dense_dp4", "dense_dp4_to_tp2", "straight_dense_tp2", DENSE_METRICS),
    ("save_dense_dp4", "dense_dp4_to_vpp2", "straight_dense_vpp2", DENSE_METRICS),
    ("save_moe_ep4", "moe_ep4_to_ep2_etp2", "straight_moe_ep2_etp2", MOE_METRICS),
    # The plain optimizer's numbers are the distributed one's (float32 Adam either way).
    ("save_old_moe_ep2", "old_moe_ep2_to_etp2", "straight_moe_ep2_etp2", MOE_METRICS),
])
def test_fully_reshardable_resume_at_another_layout_equals_the_straight_run(
        runs, saved, resumed, straight, metrics):
    assert "refusal" not in runs[resumed], runs[resumed].get("refusal")
    got = runs[saved]["history"] + runs[resumed]["history"]
    want = runs[straight]["history"]
    assert len(got) == len(want) == RESUME_ITERS
    for it, (mine, ref) in enumerate(zip(got, want), start=1):
        for key in metrics:
            assert mine[key] == pytest.approx(ref[key], rel=RTOL), (
                f"{resumed}: iteration {it} {key} {mine[key]} != straight {ref[key]}")


def test_run_args_record_the_format(runs):
    for name in ("dense_dp4", "moe_ep4"):
        recorded = json.loads((runs["folder"] / name / "iter_0000002" /
                               RUN_ARGS_FILENAME).read_text())
        assert recorded[SHARDING_TYPE_KEY] == FULLY_RESHARDABLE, name


def test_the_old_checkpoint_is_saved_as_before(runs):
    """The compatibility case is real: its expert optimizer's keys carry the chained prefix, and
    it stores no metadata (the load falls back to LEGACY_METADATA)."""
    folder = str(runs["folder"] / "old_moe_ep2" / "iter_0000002")
    keys = FileSystemReader(folder).read_metadata().state_dict_metadata
    assert any(key.startswith("chained_1.optimizer.state.exp_avg.") for key in keys)
    new_keys = FileSystemReader(str(runs["folder"] / "moe_ep4" / "iter_0000002")
                                ).read_metadata().state_dict_metadata
    assert not any(key.startswith("chained_") for key in new_keys)


def test_the_old_checkpoint_does_not_follow_ep_2_to_1(runs):
    """Its chained_<i>. keys name the expert optimizer, which EP 1 does not have: one line
    before megatron-core reads a tensor (it would miss every chained key)."""
    assert runs["old_moe_ep2_to_ep1"]["refusal"] == (
        "--load: the checkpoint was saved before its optimizer format was stored, when the "
        "tensors of chained optimizers (EP > 1) were keyed with megatron-core's chained_<i>. "
        "prefixes and a single optimizer's (EP 1) were not, so its optimizer state does not "
        "follow a change of --expert-model-parallel-size between 1 and > 1 (resume with the "
        "saved size and save again, then change it; or add --no-load-optim to load the "
        "weights only)")


def test_megatron_lms_lines_name_the_format(runs):
    """Megatron-LM's lines at a distributed-optimizer save and at a load (the stored metadata;
    None for a checkpoint saved before it was stored)."""
    lines = runs["rank 0 lines"]
    assert "Storing distributed optimizer sharded state of type fully_reshardable" in lines
    loaded = [line for line in lines
              if line.startswith("sharded_state_dict metadata loaded from the checkpoint: ")]
    assert "sharded_state_dict metadata loaded from the checkpoint: None" in loaded
    assert any("'distrib_optim_sharding_type': 'fully_reshardable'" in line for line in loaded)

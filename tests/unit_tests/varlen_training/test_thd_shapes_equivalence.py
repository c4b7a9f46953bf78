"""Fixed THD shapes never change the numbers: packed with --pad-packed-seq-alignment,
--thd-max-packed-sequences and either --thd-tail-padding-policy == packed without them ==
the unpacked run, loss and grad norm of iterations 1-5 (fp32, dropout 0, same mock SFT data).

The cap of 2-3 sequences per rank splits micro-batches (more of them than without the cap), the
tails are dummy sequences or padding of the last sequence, and the device cu_seqlens carry
trailing zero-length entries (MTP, TP + SP too): none of it may move a number.
"""

import json

import pytest

from tests.harness.multirank import run_distributed
from tests.harness.training_runs import loss_owner_history, train_on_this_rank
from tests.unit_tests.varlen_training.test_packing_equivalence import (
    NUM_ITERS, PACKED, RTOL, UNPACKED,
)

DYNAMIC_CP = ["--dynamic-context-parallel", "--context-parallel-size", "2",
              "--max-seqlen-per-dp-cp-rank", "32"]
MTP = ["--mtp-num-layers", "1"]
# name: (flags of every run, flags of the packed runs, fixed-shape flags, world size)
SHAPES = {
    # every rank padded to the 32-token budget, a dummy tail sequence, <= 3 sequences a pack
    "max_dummy_dynamic_cp": ([], DYNAMIC_CP, ["--pad-packed-seq-alignment", "max",
                                              "--thd-max-packed-sequences", "3"], 4),
    # ranks rounded up to a multiple of 8, the tail as padding of the last sequence, <= 2
    "aligned_extend_last_cp2": ([], ["--context-parallel-size", "2"],
                                ["--pad-packed-seq-alignment", "8",
                                 "--thd-tail-padding-policy", "extend_last",
                                 "--thd-max-packed-sequences", "2"], 4),
    # MTP's roll over extended last sequences (padded boundaries), under dynamic CP
    "mtp_extend_last_dynamic_cp": (MTP, DYNAMIC_CP,
                                   ["--pad-packed-seq-alignment", "max",
                                    "--thd-tail-padding-policy", "extend_last",
                                    "--thd-max-packed-sequences", "2"], 4),
    # padding_mask scattered for sequence parallelism; alignment a multiple of 2 x SP
    "tp2_sp_aligned_dynamic_cp": ([], ["--tensor-model-parallel-size", "2",
                                       "--sequence-parallel", *DYNAMIC_CP],
                                  ["--pad-packed-seq-alignment", "4",
                                   "--thd-max-packed-sequences", "3"], 4),
}
_UNPACKED = {}


def _history(argv, world):
    return loss_owner_history(run_distributed(train_on_this_rank, world, args=(argv,),
                                              timeout_s=300))


def _assert_close(got, ref, what):
    assert len(got) == len(ref) == NUM_ITERS
    for it, (g, r) in enumerate(zip(got, ref), start=1):
        for key in ("lm_loss", "grad_norm"):
            assert abs(g[key] - r[key]) <= RTOL * abs(r[key]), (
                f"{what} iteration {it} {key}: {g[key]!r} vs {r[key]!r}")


def _unpacked(shared):
    if tuple(shared) not in _UNPACKED:
        _UNPACKED[tuple(shared)] = _history(UNPACKED + shared, 2)
    return _UNPACKED[tuple(shared)]


def _microbatch_counts(path):
    return [json.loads(line)["num_microbatches"] for line in path.read_text().splitlines()]


@pytest.mark.parametrize("case", list(SHAPES))
def test_fixed_shapes_match_packed_and_unpacked(case, tmp_path):
    shared, packed, shape_flags, world = SHAPES[case]
    metrics = {name: ["--log-metrics-jsonl", str(tmp_path / f"{name}.jsonl")]
               for name in ("shaped", "plain")}
    shaped = _history(PACKED + shared + packed + shape_flags + metrics["shaped"], world)
    plain = _history(PACKED + shared + packed + metrics["plain"], world)
    _assert_close(shaped, plain, f"{case} vs packed without fixed shapes")
    _assert_close(shaped, _unpacked(shared), f"{case} vs unpacked")
    assert len({h["lm_loss"] for h in shaped}) == NUM_ITERS  # the run trains
    # The sequence cap was active: it split micro-batches the plain run packed together.
    counts = zip(_microbatch_counts(tmp_path / "shaped.jsonl"),
                 _microbatch_counts(tmp_path / "plain.jsonl"))
    assert any(capped > plain for capped, plain in counts), case


def test_hybrid_mamba_fixed_shapes_match_packed():
    """pretrain_mamba.py: Mamba's scan and conv over dummy tail sequences, extended last
    sequences and capped packs give the numbers of the same run without fixed shapes (which
    test_hybrid_equivalence.py proves equal to the single-rank unpacked run)."""
    from tests.harness.training_runs import train_hybrid_on_this_rank
    from tests.unit_tests.varlen_training.test_hybrid_equivalence import DYNAMIC

    layout = ["--context-parallel-size", "2", "--max-seqlen-per-dp-cp-rank", "16"]

    def history(extra):
        return loss_owner_history(run_distributed(train_hybrid_on_this_rank, 4,
                                                  args=(DYNAMIC + layout + extra,),
                                                  timeout_s=300))

    plain = history([])
    for shape_flags in (["--pad-packed-seq-alignment", "max", "--thd-max-packed-sequences", "3"],
                        ["--pad-packed-seq-alignment", "4", "--thd-tail-padding-policy",
                         "extend_last", "--thd-max-packed-sequences", "2"]):
        shaped = history(shape_flags)
        assert len(shaped) == len(plain) > 0
        for it, (got, ref) in enumerate(zip(shaped, plain), start=1):
            for key in ("lm_loss", "grad_norm"):
                assert abs(got[key] - ref[key]) <= RTOL * abs(ref[key]), (
                    shape_flags, it, key, got[key], ref[key])


def test_the_padding_mask_reaches_the_model():
    """pretrain_gpt.py's forward step and the facade's GPT flow hand the micro-batch's
    padding_mask to the model (megatron-core's GPTModel/MambaModel take it for MoE routing)."""
    import torch

    from megatron.varlen_training.training import forward_step
    from megatron.wrap.flows.gpt import GPTFlow

    mask = torch.tensor([[False, True]])
    batch = {"tokens": torch.zeros(1, 2, dtype=torch.long), "labels": torch.zeros(1, 2),
             "position_ids": torch.zeros(1, 2, dtype=torch.long), "loss_mask": torch.ones(1, 2),
             "padding_mask": mask}
    seen = {}

    def model(*args, **kwargs):
        seen.update(kwargs)
        return torch.zeros(1, 2)

    forward_step(iter([batch]), model)
    assert seen["padding_mask"] is mask
    inputs, _ = GPTFlow.collate_micro_batch(None, batch)
    assert inputs["padding_mask"] is mask

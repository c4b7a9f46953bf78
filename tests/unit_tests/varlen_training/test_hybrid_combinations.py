"""Hybrid Mamba cells beyond test_hybrid_equivalence's model: each equals its single-rank run.

Cells of tools/probe_hybrid_combinations.py (VARIANT/LAYOUT/RECOMPUTE; the probe's table is in
docs/MAMBA.md): every iteration's lm loss AND grad norm within 1e-5 of the variant's
reference -- the single-rank unpacked run, or for documents cut out of pretraining samples
(whose unpacked run is refused: the scan would cross documents) the single-rank packed run.
Grad norms matter: the optimizer's clipping and Adam's normalisation make a gradient that is
off by a uniform factor invisible in the losses (a skipped token-count all-reduce moved the
grad norm 4-8x with every loss equal to 1e-7).
"""

import pytest

from tests.harness.multirank import run_distributed
from tests.harness.training_runs import loss_owner_history, train_hybrid_on_this_rank
from tools.probe_hybrid_combinations import cell_argv, parse_cell, reference_cell

RTOL = 1e-5
CELLS = (
    # GQA, untied output layer, attention as the last layer; TP x dynamic CP, full recompute
    "gqa_untied_attn_last/d_tp2_cp2/full_block",
    # conversations: loss on assistant tokens only, dynamic CP over DP x CP = 4
    "sft_masks/d_dp2_cp2/none",
    # pretraining samples cut at end-of-document tokens into THD sequences, dynamic CP
    "documents/d_dp2_cp2/none",
    # Mamba + MLP only, unpacked static CP (SBHD all-to-all in every layer)
    "no_attn/u_cp2/none",
    # Megatron-LM's mean loss (no --calculate-per-token-loss) under unpacked static CP: the
    # micro-batch's mean over all CP slices, not a mean of per-slice means (37% off before)
    "mean_loss/u_cp2/none",
)


def _run(cell: str) -> tuple[list[float], list[float]]:
    argv, world = cell_argv(*parse_cell(cell))
    history = loss_owner_history(run_distributed(train_hybrid_on_this_rank, world,
                                                 args=(argv,), timeout_s=240))
    return [h["lm_loss"] for h in history], [h["grad_norm"] for h in history]


@pytest.mark.parametrize("cell", CELLS)
def test_cell_matches_its_single_rank_reference(cell):
    variant, layout, _ = parse_cell(cell)
    want_losses, want_norms = _run(reference_cell(variant, layout))
    assert len(set(want_losses)) == len(want_losses), want_losses  # the loss moves
    losses, norms = _run(cell)
    for name, got, want in (("lm loss", losses, want_losses), ("grad norm", norms, want_norms)):
        assert len(got) == len(want)
        for it, (value, ref) in enumerate(zip(got, want), start=1):
            assert abs(value - ref) <= RTOL * abs(ref), (
                f"{cell} iteration {it} {name}: {value!r} vs reference {ref!r}")

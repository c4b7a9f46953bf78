"""Feature combinations that were silently wrong (or crashed) now equal the single-rank run.

Each case is a cell of tools/probe_combinations.py (FEATURE/LAYOUT[/RECOMPUTE]: the tiny model,
mock SFT data with loss masks, fp32, dropout 0, 3 iterations) and is compared with the same
model trained unpacked on ONE rank: every iteration's lm loss (and MoE balancing losses) and
grad norm within 1e-5 relative. The whole probed matrix, equal cells included, is in
docs/ARCHITECTURE.md ("What the equivalence tests check").
"""

import pytest

from tools.probe_combinations import (
    REFERENCE_LAYOUT, RTOL, SAME_MICROBATCHES, compare, launch, launch_resume, parse_cell,
)

# cell: what was wrong before the fix
CELLS = {
    # MTP with packing and PP: every stage ran the MTP branch (AttributeError on the first).
    # Learned positions + MTP + PP: the last stage's MTP copy of the position embeddings never
    # met the first stage's gradient (grad norm 1.6e-3 off at iteration 3).
    "mtp1_learned/p_pp2": "crashed; then grad norm 1.6e-3 off",
    "mtp1_learned/u_vpp2": "grad norm 1.6e-3 off at iteration 3",
    # Unpacked CP without --calculate-per-token-loss: each CP slice divided by its own count of
    # loss tokens (grad norm 24% off at iteration 2).
    "mean_loss/u_cp2": "grad norm 0.24 off",
    # MoE without --calculate-per-token-loss under SP (and CP): the router z-loss divided each
    # share's terms by its own count of real tokens (grad norm 1.4e-3 off at iteration 3).
    "moe_mean_loss/u_tp2_sp": "grad norm 1.4e-3 off",
    # Hybrid MoE stack, unpacked, full recomputation: the recomputed layers lost the padding
    # mask, so their routers balanced over padding (grad norm 53% off at iteration 1).
    "hybrid_moe/u_tp2_sp/full_uniform": "grad norm 0.53 off",
    # GPT MoE, unpacked, --recompute-method block: megatron-core 0.16.1 runs the layers it does
    # not recompute without the padding mask (grad norm 0.94 off at iteration 3).
    "moe/u_pp2/full_block": "grad norm 0.94 off",
}
# cell: why it is kept although the probe found it equal (new ground: what would break it)
NEW_GROUND = {
    # Aux-loss-free balancing: after every step megatron-core moves each expert's bias by the
    # sign of (average - count), counts all-reduced over TP x DP x CP; our router must count
    # real tokens only, or CP padding and dynamic CP groups change the update.
    "moe_expert_bias/d_dp2_cp2": "expert bias counts over real tokens, any layout",
}
_REFERENCES = {}


def _reference(feature: str) -> list[dict]:
    if feature not in _REFERENCES:
        run = launch(feature, REFERENCE_LAYOUT, "none")
        assert run["status"] == "ran", run
        _REFERENCES[feature] = run["history"]
    return _REFERENCES[feature]


@pytest.mark.parametrize("cell", [*CELLS, *NEW_GROUND])
def test_cell_matches_single_rank_unpacked(cell):
    feature, layout, recompute = parse_cell(cell)
    reference = _reference(feature)
    assert len({step["lm_loss"] for step in reference}) > 1, "the losses must move"
    run = launch(feature, layout, recompute)
    assert run["status"] == "ran", f"{cell}: {run.get('error', run.get('reason'))}"
    gap, where = compare(run["history"], reference)
    why = f"before the fix: {CELLS[cell]}" if cell in CELLS else f"kept for: {NEW_GROUND[cell]}"
    assert gap <= RTOL, f"{cell}: {where} (rel gap {gap:.2e} > {RTOL}; {why})"


# cell: what failed before the fix (each save of the cell's first half, on the last stage)
RESUME_CELLS = {
    # Virtual stages without the distributed optimizer: the chunks' state dicts were merged by
    # local name, so the optimizer's parameters matched none ("Param id 0 does not match").
    # MTP on the last stage: megatron-core's GPTModel needs the DP x CP group in its metadata;
    # its stray output-layer weight (tied embeddings) trips its own assertion; the learned
    # position embeddings' MTP copy was a second main replica ("Invalid access pattern").
    "mtp1_learned/u_vpp2": "four save failures in a row",
}


@pytest.mark.parametrize("cell", list(RESUME_CELLS))
def test_cell_resumes_like_the_straight_run(cell, tmp_path):
    """Half + save + load + half == straight, bit for bit (same layout)."""
    run = launch_resume(*parse_cell(cell), str(tmp_path))
    assert run["status"] == "ran", f"{cell}: {run.get('error', run.get('reason'))}"
    assert run["resumed"] == run["history"], (
        f"{cell}: resumed {run['resumed']} != straight {run['history']}")


# cell: what was wrong before the fix. Their features differ from the unpacked run by
# definition (probe_combinations.BY_DEFINITION), so each is compared with its twin: the layout
# that packs the same micro-batches without the model parallelism the cell adds
# (probe_combinations.SAME_MICROBATCHES).
TWIN_CELLS = {
    # global_aux_loss with packing and PP: the pipeline reordered the step's micro-batches
    # (small ones where the pipeline fills and drains), and the loss balances against the
    # running average of the micro-batches so far (at iteration 2 PP 2 was 3.9e-2 off PP 1 in
    # global_load_balancing_loss, 2.2e-3 in grad norm).
    "moe_global_aux/p_pp2": "global_load_balancing_loss 3.9e-2 off at iteration 2",
}


@pytest.mark.parametrize("cell", list(TWIN_CELLS))
def test_cell_matches_its_twin_layout(cell):
    feature, layout, recompute = parse_cell(cell)
    twin = launch(feature, SAME_MICROBATCHES[layout], "none")
    assert twin["status"] == "ran", twin
    assert len({step["lm_loss"] for step in twin["history"]}) > 1, "the losses must move"
    run = launch(feature, layout, recompute)
    assert run["status"] == "ran", f"{cell}: {run.get('error', run.get('reason'))}"
    gap, where = compare(run["history"], twin["history"])
    assert gap <= RTOL, (f"{cell}: {where} (rel gap {gap:.2e} > {RTOL}; before: "
                         f"{TWIN_CELLS[cell]})")

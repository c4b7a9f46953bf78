"""Unpacked MoE + MTP + static CP is allowed when the MTP layers are dense (moe_arguments.py).

The refusal of unpacked MoE + MTP + CP > 1 exists for the MTP layers' routers (each sample's
last positions must be masked, which a CP-split sample cannot give them). MTP layers are built
like the last decoder layer, so with ``--moe-layer-freq [1,0]`` they are dense and have no
router: the run is allowed, and it must equal the single-rank unpacked run (the same model,
data and seed on one rank, no CP) in lm loss, the MoE balancing losses and the grad norm at
every iteration, within float32 rounding.
"""

import pytest

from megatron.varlen_training.arguments import ArgumentValidationError
from megatron.varlen_training.config.from_flags import parse_run_config
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import loss_owner_history, train_on_this_rank
from tests.unit_tests.varlen_training.test_moe_equivalence import (
    GPT, METRICS, MTP, NUM_ITERS, RTOL, UNPACKED,
)

DENSE_LAST = ["--moe-layer-freq", "[1,0]"]  # layer 1 MoE, layer 2 (and so the MTP layer) dense
MODEL = GPT + MTP + DENSE_LAST + UNPACKED
CP2 = ["--context-parallel-size", "2"]
RUN_TIMEOUT_S = 240


def _history(argv: list[str], world: int) -> list[dict]:
    results = run_distributed(train_on_this_rank, world, args=(argv,), timeout_s=RUN_TIMEOUT_S)
    history = loss_owner_history(results)
    assert len(history) == NUM_ITERS
    return history


def test_the_mtp_layer_is_dense_and_the_decoder_has_moe():
    moe = parse_run_config(MODEL + CP2, world_size=2).model.moe
    assert moe.is_moe_layer(2) == [True, False] and not moe.mtp_layers_are_moe(2)


def test_moe_mtp_layers_keep_the_refusal():
    with pytest.raises(ArgumentValidationError, match="needs --sequence-packing when the MTP "
                                                      "layers are MoE, as here"):
        parse_run_config(GPT + MTP + ["--moe-layer-freq", "[0,1]"] + UNPACKED + CP2,
                         world_size=2)


@pytest.mark.parametrize("freq, allowed", [
    ("2", True),              # every 2nd layer from the first: layer 2 of 2 is dense
    ("([1]*1+[0])", True),    # Megatron-LM's pattern form, last entry 0
    ("1", False),             # every layer MoE, so the MTP layer too
    ("[0,1]", False),
])
def test_the_refusal_follows_the_last_layer_of_moe_layer_freq(freq, allowed):
    argv = GPT + MTP + ["--moe-layer-freq", freq] + UNPACKED + CP2
    if allowed:
        assert not parse_run_config(argv, world_size=2).model.moe.mtp_layers_are_moe(2)
        return
    with pytest.raises(ArgumentValidationError) as err:
        parse_run_config(argv, world_size=2)
    assert f"which --moe-layer-freq {freq} makes MoE" in str(err.value)


def test_unpacked_cp2_with_dense_mtp_equals_the_single_rank_run():
    reference = _history(MODEL, 1)
    got = _history(MODEL + CP2, 2)
    assert len({step["lm_loss"] for step in reference}) == NUM_ITERS  # the model trains
    for it, (step, ref) in enumerate(zip(got, reference), start=1):
        for key in METRICS:
            assert ref[key] is not None and ref[key] > 0, (key, ref)
            assert step[key] == pytest.approx(ref[key], rel=RTOL), (
                f"iteration {it} {key}: CP2 {step[key]!r} vs one rank {ref[key]!r}")

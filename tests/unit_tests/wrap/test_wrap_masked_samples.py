"""Samples without a token to train on (loss_mask all 0), on one rank.

Reference: counting. Such a sample adds nothing to the loss's sum nor to its token count (nor,
with ``loss_normalization: sample``, to the number of samples the mean runs over), so a batch
with one trains exactly like the batch without it: the same loss, grad norm and evaluation, for
both normalisations. A batch of only such samples reports a loss and grad norm of 0, never
NaN (Megatron-LM's per-token loss would log 0/0 there).
"""

from megatron.wrap import MegatronWrap
from tests.harness.multirank import run_distributed
from tests.unit_tests.wrap.test_wrap_runtime_batch_sizes import CONFIG, _batch

RTOL = 1e-6
MASKED = {"tokens": [5, 6, 7, 8], "labels": [6, 7, 8, 9], "loss_mask": [0, 0, 0, 0]}
NORMALIZATIONS = ("token", "sample")


def _first_step(normalization: str, batch: list[dict]) -> dict:
    config = {**CONFIG, "flow": {"flow_args": {"loss_normalization": normalization}}}
    with MegatronWrap(config) as wrap:
        wrap.initialize().setup_model_and_optimizer()
        evaluated = wrap.evaluate(batch)["loss"]
        step = wrap.train(batch)
        return {"loss": step["loss"], "grad_norm": step["grad_norm"], "evaluated": evaluated}


def rank_masked_samples() -> dict:
    batch = _batch(0, 3)
    with_masked = batch[:1] + [MASKED] + batch[1:]
    return {normalization: {"plain": _first_step(normalization, batch),
                            "with_masked": _first_step(normalization, with_masked),
                            "all_masked": _first_step(normalization, [MASKED, MASKED])}
            for normalization in NORMALIZATIONS}


def test_a_fully_masked_sample_adds_nothing():
    got = run_distributed(rank_masked_samples, 1, timeout_s=240)[0]
    for normalization in NORMALIZATIONS:
        runs = got[normalization]
        for key in ("loss", "grad_norm", "evaluated"):
            want, have = runs["plain"][key], runs["with_masked"][key]
            assert want > 0 and abs(have - want) <= RTOL * want, (normalization, key, runs)
        assert runs["all_masked"] == {"loss": 0.0, "grad_norm": 0.0, "evaluated": 0.0}, runs
    # the two normalisations differ on this batch (its samples train different token counts)
    assert got["token"]["plain"]["loss"] != got["sample"]["plain"]["loss"]

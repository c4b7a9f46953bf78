"""gpt_sft's per-sample loss normalisation (megatron-wrap's SFT loss), proven by counting:
with sample lengths n1 = 2 * n2, the mean of the two per-sample means equals the per-token mean
of the batch [s1, s2, s2], so losses and gradient norms of the two runs must agree step by
step, on 2 ranks where the two batches are packed and split differently. (A batch may hold
more or fewer samples than global_batch_size; the LR here is constant.)"""

import pytest

from megatron.wrap import MegatronWrap
from tests.harness.multirank import run_distributed
from tests.unit_tests.wrap.megatron_wrap_format import VIEW, write_nest

S1 = {"input_ids": [4, 8, 15, 16, 23, 42, 7, 9, 11]}  # 8 trained tokens
S2 = {"input_ids": [3, 1, 4, 1, 5]}                  # 4 trained tokens
STEPS = 2
PER_SAMPLE_VIEW = VIEW.replace("    __select__: gpt_sft\n",
                               "    __select__: gpt_sft\n    __override__:\n"
                               "      loss_normalization: sample\n")


def rank_losses(view: str, batch: list, gbs: int) -> list[tuple[float, float]]:
    wrap = MegatronWrap(view, overrides=[f"megatron_lm.train.common.global_batch_size={gbs}"])
    wrap.initialize()
    wrap.setup_model_and_optimizer()
    out = []
    for _ in range(STEPS):
        metrics = wrap.train(batch)
        out.append((metrics["loss"], metrics["grad_norm"]))
    wrap.close()
    return out


def test_per_sample_mean_equals_per_token_mean_of_the_length_balanced_batch(tmp_path):
    per_sample = run_distributed(rank_losses, 2, args=(
        str(write_nest(tmp_path / "sample", PER_SAMPLE_VIEW)), [S1, S2], 2), timeout_s=180)
    per_token = run_distributed(rank_losses, 2, args=(
        str(write_nest(tmp_path / "token")), [S1, S2, S2], 2), timeout_s=180)
    for (loss_a, norm_a), (loss_b, norm_b) in zip(per_sample[0], per_token[0]):
        assert loss_a == pytest.approx(loss_b, rel=1e-5)
        assert norm_a == pytest.approx(norm_b, rel=1e-5)
    assert per_sample[0] == per_sample[1]  # every rank reports the same


def test_per_sample_differs_from_per_token_on_the_same_batch(tmp_path):
    per_sample = run_distributed(rank_losses, 2, args=(
        str(write_nest(tmp_path / "sample", PER_SAMPLE_VIEW)), [S1, S2], 2), timeout_s=180)
    per_token = run_distributed(rank_losses, 2, args=(
        str(write_nest(tmp_path / "token")), [S1, S2], 2), timeout_s=180)
    assert abs(per_sample[0][0][0] - per_token[0][0][0]) > 1e-4

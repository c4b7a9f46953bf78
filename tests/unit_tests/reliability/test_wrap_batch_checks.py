"""With batch_source 'all_ranks' the ranks must hold the same
batch, and loss_mask entries must be 0 or 1 -- one-line ValueErrors on every rank, after which
training goes on (no rank left waiting in a collective). The facade's train() also stops at a
NaN loss (--check-for-nan-in-loss-and-grad) on every rank."""

from megatron.varlen_training.errors import NonFiniteLossError
from megatron.wrap import GPTSFTFlow, MegatronWrap, register_flow
from tests.harness.multirank import run_distributed


@register_flow("test_nan_loss", replace=True)
class NaNLossFlow(GPTSFTFlow):
    """The default flow with its loss (not its report) multiplied by NaN: NaN gradients."""

    def loss(self, output, loss_inputs):
        loss_sum, num_tokens, metrics = super().loss(output, loss_inputs)
        return loss_sum * float("nan"), num_tokens, metrics

CONFIG = {
    "model": {"num_layers": 1, "hidden_size": 16, "num_attention_heads": 2, "seq_length": 32,
              "vocab_size": 64, "make_vocab_size_divisible_by": 16},
    "training": {"micro_batch_size": 1, "global_batch_size": 2, "train_iters": 3, "lr": 1e-3,
                 "seed": 5, "eval_iters": 0},
    "data": {"tokenizer_type": "NullTokenizer"},
    "logging": {"metric_writers": [], "progress_bar": False},
}


def _sample(n, mask=None):
    sample = {"tokens": list(range(1, n + 1)), "labels": list(range(2, n + 2))}
    if mask is not None:
        sample["loss_mask"] = mask
    return sample


def _message(wrap, batch):
    try:
        wrap.train(batch, source="all_ranks")
    except ValueError as err:
        return str(err)
    return None


def rank_checks() -> dict:
    with MegatronWrap(CONFIG) as wrap:
        wrap.initialize().setup_model_and_optimizer()
        count = 4 if wrap.rank == 0 else 6
        other_count = _message(wrap, [_sample(5) for _ in range(count)])
        tokens = [1, 2, 3] if wrap.rank == 0 else [1, 2, 4]
        other_tokens = _message(wrap, [{"tokens": tokens, "labels": [2, 3, 4]}] * 2)
        negative = _message(wrap, [_sample(3, [1, -5, 1]), _sample(3)])
        fractional = _message(wrap, [_sample(3), _sample(3, [1, 0.5, 1])])
        good = wrap.train([_sample(5), _sample(7)], source="all_ranks")
    with MegatronWrap(CONFIG, overrides={"flow.flow_name": "test_nan_loss"}) as wrap:
        wrap.initialize().setup_model_and_optimizer()
        try:
            wrap.train([_sample(5), _sample(7)])
            nan = None
        except NonFiniteLossError as err:
            nan = str(err)
    return {"count": other_count, "tokens": other_tokens, "negative": negative,
            "fractional": fractional, "iteration": good["iteration"], "nan": nan}


def test_batch_checks_are_one_line_on_every_rank():
    first, second = run_distributed(rank_checks, 2, timeout_s=120)
    for key in ("count", "tokens", "negative", "fractional"):
        assert first[key] is not None and "\n" not in first[key], (key, first[key])
    assert first["count"] == second["count"] == (
        "train(): the batch differs across ranks with batch_source 'all_ranks' (ranks [1] "
        "differ from rank 0; rank 0: 4 samples, 20 tokens; rank 1: 6 samples, 30 tokens): pass "
        "the same global batch on every rank, or use batch_source 'rank0' (config key "
        "'wrap.batch_source')")
    assert first["tokens"] == second["tokens"] and "ranks [1] differ" in first["tokens"]
    assert first["negative"] == second["negative"] == (
        "sample 0, field 'loss_mask': entry 1 is -5; entries must be 0 or 1")
    assert first["fractional"].endswith("entry 1 is 0.5; entries must be 0 or 1")
    assert first["iteration"] == second["iteration"] == 1
    assert first["nan"] == second["nan"] and first["nan"].startswith(
        "iteration 1: grad norm is NaN/Inf"), first["nan"]  # the report is kept finite

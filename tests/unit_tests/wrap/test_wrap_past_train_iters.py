"""``MegatronWrap.train()`` past ``train_iters``: Megatron-LM's loop stops there, megatron-wrap's
loop is the caller's, so the step runs (an RL job is not killed at its last step) and one
warning names the iteration and train_iters (docs/WRAP.md section 1).

Reference for the LR: the config's own ``min_lr`` (a linear decay over train_iters ends there,
megatron-core's ``OptimizerParamScheduler`` keeps it past the decay)."""

import logging

from tests.harness.multirank import run_distributed

TRAIN_ITERS, CALLS = 2, 5
LR, MIN_LR = 1e-3, 1e-4
WARNING = "is past train_iters"
CONFIG = {
    "model": {"num_layers": 1, "hidden_size": 16, "num_attention_heads": 2, "seq_length": 32,
              "vocab_size": 64, "make_vocab_size_divisible_by": 32},
    "training": {"micro_batch_size": 1, "global_batch_size": 2, "train_iters": TRAIN_ITERS,
                 "lr": LR, "min_lr": MIN_LR, "lr_decay_style": "linear", "seed": 3,
                 "eval_iters": 0},
    "data": {"tokenizer_type": "NullTokenizer"},
    "logging": {"metric_writers": [], "progress_bar": False},
}


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def rank_train_past_the_end() -> list[tuple[int, float, list[str]]]:
    """(iteration, lr, the warnings about train_iters so far) after each of CALLS steps."""
    from megatron.varlen_training import log
    from megatron.wrap import MegatronWrap

    handler = _Warnings()
    log.get_logger().addHandler(handler)
    steps = []
    try:
        with MegatronWrap(CONFIG) as wrap:
            wrap.initialize().setup_model_and_optimizer()
            for call in range(CALLS):
                batch = [{"input_ids": [(call + 3 * i + j) % 60 + 1 for j in range(6 + i)]}
                         for i in range(2)]
                metrics = wrap.train(batch)
                warned = [m for m in handler.messages if WARNING in m]
                steps.append((metrics["iteration"], metrics["lr"], warned))
    finally:
        log.get_logger().removeHandler(handler)
    return steps


def test_steps_past_train_iters_run_with_one_warning():
    steps = run_distributed(rank_train_past_the_end, 1, timeout_s=240)[0]
    assert [iteration for iteration, _, _ in steps] == list(range(1, CALLS + 1))
    for iteration, lr, warned in steps:
        if iteration <= TRAIN_ITERS:
            assert warned == [], (iteration, warned)  # Megatron-LM's own steps: no word
        else:
            assert len(warned) == 1, (iteration, warned)  # once, not every step
            assert lr == MIN_LR  # the schedule's end value, kept
    message = steps[-1][2][0]
    assert message.startswith(f"train(): iteration {TRAIN_ITERS + 1} is past train_iters "
                              f"{TRAIN_ITERS}, where Megatron-LM's loop stops"), message
    assert "raise training.train_iters" in message

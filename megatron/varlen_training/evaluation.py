"""When ``pretrain_gpt.py`` / ``pretrain_mamba.py`` evaluate, and on which samples: Megatron-LM's
schedule (its ``training.py``).

- Every ``--eval-interval`` iterations: ``--eval-iters`` global batches of the validation split.
- At the end of training (not after an exit condition stopped the run): once more on the
  validation split (also when the last iteration just evaluated), then ``--eval-iters`` global
  batches of the test split when the run has one (:mod:`.datasets.builder`).

Megatron-LM reads its validation samples through one iterator: each evaluation continues where
the previous one stopped, and a resumed run restarts it after
``iteration // eval_interval x eval_iters`` global batches (its ``consumed_valid_samples``). The
k-th evaluation (0-based) thus reads validation global batches ``[k x eval_iters, (k + 1) x
eval_iters)``; here that index is derived from the iteration, so a resumed run reads the same
batches as an uninterrupted one without a counter in the checkpoint. The test split is read
from its first batch, once.

Every evaluation prints Megatron-LM's validation line (between rules of dashes) and hands the
loss to the run's metric writers (``lm loss validation`` / ``lm loss test`` for TensorBoard and
wandb, :func:`.metric_writers.evaluation_key`).
"""

from __future__ import annotations

from megatron.varlen_training import log, loop_steps, training
from megatron.varlen_training.config.training import TrainingConfig

VALIDATION, TEST = "validation", "test"
# How the end-of-training lines name their split (Megatron-LM's prefixes).
END_OF_TRAINING = {VALIDATION: " on validation set", TEST: " on test set"}


def in_loop_evaluation_due(training_config: TrainingConfig, iteration: int) -> bool:
    """Whether the loop evaluates after ``iteration`` (every ``--eval-interval``-th)."""
    return training_config.eval_iters > 0 and iteration % training_config.eval_interval == 0


def first_validation_batch(training_config: TrainingConfig, iteration: int,
                           at_end: bool) -> int:
    """The first validation global batch of the evaluation after ``iteration``: the batches
    the evaluations before it read are skipped (module docstring). ``at_end``: the
    end-of-training evaluation, which follows every in-loop one."""
    in_loop_so_far = iteration // training_config.eval_interval
    before = in_loop_so_far if at_end else in_loop_so_far - 1
    return before * training_config.eval_iters


def _evaluate(trainer, provider, first_index: int, name: str, where: str,
              verbose: bool) -> float | None:
    """One evaluation: its loss (None off the loss-owning ranks), logged and written."""
    run, state = trainer.run, trainer.state
    on_batch = None
    if verbose:  # Megatron-LM's progress lines for its end-of-training evaluations
        eval_iters = run.training.eval_iters
        log.print_rank_0(f"Evaluating on {eval_iters * run.training.global_batch_size} samples")
        on_batch = lambda i: log.print_rank_0(f"Evaluating iter {i}/{eval_iters}")  # noqa: E731
    loss = training.evaluate(run, state, provider, first_index, on_batch)
    loop_steps.log_validation_loss(state.iteration, loss, where)
    if loss is not None:
        for writer in trainer.writers:
            writer.write_evaluation(name, loss, state.iteration, state.consumed_train_samples)
    return loss


def evaluate_in_loop(trainer, valid_provider) -> float | None:
    """The validation loss after this iteration if it is an ``--eval-interval`` multiple (and
    the run has validation data), else None."""
    training_config, iteration = trainer.run.training, trainer.state.iteration
    if valid_provider is None or not in_loop_evaluation_due(training_config, iteration):
        return None
    first = first_validation_batch(training_config, iteration, at_end=False)
    return _evaluate(trainer, valid_provider, first, VALIDATION, "", verbose=False)


def evaluate_at_end(trainer, valid_provider, test_provider) -> dict:
    """The end-of-training evaluations: {"end_validation_loss", "test_loss"} (None where the
    split is missing, --eval-iters is 0, or off the loss-owning ranks)."""
    training_config, iteration = trainer.run.training, trainer.state.iteration
    losses = {"end_validation_loss": None, "test_loss": None}
    if training_config.eval_iters <= 0:
        return losses
    if valid_provider is not None:
        first = first_validation_batch(training_config, iteration, at_end=True)
        losses["end_validation_loss"] = _evaluate(
            trainer, valid_provider, first, VALIDATION, END_OF_TRAINING[VALIDATION], True)
    if test_provider is not None:
        losses["test_loss"] = _evaluate(trainer, test_provider, 0, TEST, END_OF_TRAINING[TEST],
                                        True)
    return losses

"""When ``pretrain_gpt.py`` / ``pretrain_mamba.py`` evaluate, and on which samples: Megatron-LM's
schedule (its ``training.py``).

- Every ``--eval-interval`` iterations (from ``--start-eval-at-iter`` on): ``--eval-iters``
  global batches of the validation split.
- At the end of training (not after an exit condition stopped the run): once more on the
  validation split (also when the last iteration just evaluated), then ``--eval-iters`` global
  batches of the test split when the run has one (:mod:`.datasets.builder`).
- With ``--full-validation``, every validation reads the whole validation split, from its
  first sample, the last global batch partial (``PackedBatchProvider.whole_split``); nothing
  is counted in ``consumed_valid_samples`` (Megatron-LM's cyclic validation iterator
  restarts too), and a resume needs no check of its reads.
- With ``--skip-train``, only those two, of the model as loaded (``--load``), on the first
  ``--eval-iters`` batches of each split, and the run exits (:func:`evaluate_only`).

Megatron-LM reads its validation samples through one iterator: each evaluation continues where
the previous one stopped, and a resumed run restarts it after the checkpoint's
``consumed_valid_samples``. Here the run state counts them the same way
(``TrainState.consumed_valid_samples``: ``--eval-iters`` x ``--global-batch-size`` more after
each validation), the checkpoint records them (``run_args.json``) and a resumed run continues
from exactly them, whatever ``--eval-interval`` / ``--eval-iters`` / evaluation batch size it
resumes with (:func:`continue_validation`); a checkpoint saved
before they were recorded derives them from its iteration, as Megatron-LM does for its older
checkpoints (``iteration // eval_interval x eval_iters`` global batches;
:func:`.checkpoint.consumed_valid_samples_at`). The validation split is built for the
evaluations of an uninterrupted run (``--eval-iters`` x (``--train-iters // --eval-interval``
+ 1) global batches): a resume whose flags would read past it is refused at start-up in one
line (:func:`check_resumed_validation`). The test split is read from its first batch, once.

Every evaluation prints Megatron-LM's validation line (between rules of dashes) and hands the
loss to the run's metric writers (``lm loss validation`` / ``lm loss test`` for TensorBoard and
wandb, :func:`.metric_writers.evaluation_key`).
"""

from __future__ import annotations

import dataclasses

from megatron.varlen_training import log, loop_steps, training
from megatron.varlen_training.batch_rampup import BatchAnchor
from megatron.varlen_training.config.training import TrainingConfig
from megatron.varlen_training.errors import CheckpointError
from megatron.varlen_training.run_description import evaluates_after, in_loop_evaluations
from megatron.varlen_training.validation_sets import VALIDATION, each_validation_set

TEST = "test"
# How the end-of-training lines name their split (Megatron-LM's prefixes).
END_OF_TRAINING = {VALIDATION: " on validation set", TEST: " on test set"}


def in_loop_evaluation_due(training_config: TrainingConfig, iteration: int) -> bool:
    """Whether the loop evaluates after ``iteration`` (every ``--eval-interval``-th, from
    ``--start-eval-at-iter`` on: :func:`.run_description.evaluates_after`)."""
    return training_config.eval_iters > 0 and evaluates_after(
        iteration, training_config.eval_interval, training_config.start_eval_at_iter)


def evaluations_left(training_config: TrainingConfig, iteration: int) -> int:
    """The validation evaluations a run at ``iteration`` still runs until --train-iters: the
    in-loop ones after it, and the end-of-training one."""
    interval, start = training_config.eval_interval, training_config.start_eval_at_iter
    return (in_loop_evaluations(training_config.train_iters, interval, start)
            - in_loop_evaluations(iteration, interval, start) + 1)


def check_resumed_validation(training_config: TrainingConfig, iteration: int,
                             consumed_valid_samples: int, eval_samples: int) -> None:
    """Refuses, in one line, a resumed run whose evaluations would read past the validation
    split (``eval_samples``, built for this run's flags) from the checkpoint's
    ``consumed_valid_samples`` on: a resume with a larger --eval-interval or fewer --eval-iters
    than the run that read them (Megatron-LM's iterator can run dry mid-run there)."""
    if training_config.eval_iters <= 0 or eval_samples <= 0:
        return
    batch = training_config.eval_iters * training_config.eval_batch_size
    needed = consumed_valid_samples + evaluations_left(training_config, iteration) * batch
    if needed > eval_samples:
        raise CheckpointError(
            f"--load: the checkpoint's evaluations read {consumed_valid_samples} validation "
            f"samples; the evaluations left until --train-iters {training_config.train_iters} "
            f"(every --eval-interval {training_config.eval_interval}, --eval-iters "
            f"{training_config.eval_iters}) would read up to sample {needed}, past the "
            f"{eval_samples} the validation split holds: resume with a smaller --eval-interval, "
            f"more --eval-iters or a larger --eval-global-batch-size (the saved run's values "
            f"fit)")


def continue_validation(valid_provider, consumed_valid_samples: int) -> None:
    """A resumed run's evaluations read on from exactly the validation samples its checkpoint
    consumed, as Megatron-LM's sampler does, also where the evaluation batch does not divide
    them (a resume with another --global-batch-size or --eval-global-batch-size): each
    validation set's batch schedule is anchored there; the next evaluation reads batch
    ``consumed // size`` (:func:`_next_validation_batch`), which then starts at ``consumed``.
    Not for --full-validation, which reads each split from its first sample."""
    for _, provider in each_validation_set(valid_provider):
        schedule = provider.schedule
        anchor = BatchAnchor(consumed_valid_samples // schedule.global_batch_size,
                             consumed_valid_samples)
        provider.schedule = dataclasses.replace(schedule, anchor=anchor)


def _evaluate(trainer, provider, first_index: int, name: str, where: str,
              verbose: bool, write: bool = True) -> float | None:
    """One evaluation: its loss (None off the loss-owning ranks), logged, and written to the
    metric writers unless not ``write``."""
    run, state = trainer.run, trainer.state
    whole = getattr(provider, "whole_split", False)  # --full-validation: the split to its end
    num_batches = provider.num_batches() if whole else run.training.eval_iters
    first_index = 0 if whole else first_index  # from its first sample, every time
    on_batch = None
    if verbose:  # Megatron-LM's progress lines for its end-of-training evaluations
        samples = len(provider.dataset) if whole else num_batches * run.training.eval_batch_size
        log.print_rank_0(f"Evaluating on {samples} samples")
        on_batch = lambda i: log.print_rank_0(f"Evaluating iter {i}/{num_batches}")  # noqa: E731
    loss = training.evaluate(run, state, provider, first_index, on_batch, num_batches)
    if name == VALIDATION and not whole:  # Megatron-LM's consumed_valid_samples: it moves on
        state.consumed_valid_samples += run.training.eval_iters * run.training.eval_batch_size
    loop_steps.log_validation_loss(state.iteration, loss, where, name if name != TEST
                                   else VALIDATION)  # Megatron-LM's test line too
    if loss is not None and write:
        trainer.write_evaluation(name, loss)
    return loss


def _next_validation_batch(trainer) -> int:
    """The first validation global batch the next evaluation reads: the ones read so far are
    skipped (module docstring)."""
    return trainer.state.consumed_valid_samples // trainer.run.training.eval_batch_size


def _validate(trainer, valid, where: str, verbose: bool, write: bool = True,
              first_index: int | None = None) -> dict[str, float | None]:
    """Each validation set's evaluation: {set name: loss}, named as Megatron-LM's lines and
    TensorBoard keys name it (``validation``; ``validation-wiki``, ... with
    --multiple-validation-sets: :mod:`.validation_sets`)."""
    losses = {}
    for name, provider in each_validation_set(valid):
        first = _next_validation_batch(trainer) if first_index is None else first_index
        losses[name] = _evaluate(trainer, provider, first, name, where, verbose, write)
    return losses


def _history_value(losses: dict[str, float | None]) -> float | None | dict[str, float | None]:
    """A validation as pretrain()'s history reports it: the validation split's loss, or with
    --multiple-validation-sets the {set name: loss} mapping itself."""
    return losses[VALIDATION] if VALIDATION in losses else losses


def evaluate_in_loop(trainer, valid_provider):
    """The validation loss after this iteration if it is an ``--eval-interval`` multiple (and
    the run has validation data), else None; {set name: loss} with --multiple-validation-sets."""
    training_config, iteration = trainer.run.training, trainer.state.iteration
    if valid_provider is None or not in_loop_evaluation_due(training_config, iteration):
        return None
    with trainer.hooks.around_evaluation():  # --manual-gc collects around it (Megatron-LM)
        return _history_value(_validate(trainer, valid_provider, "", verbose=False))


def _evaluate_end_of_training(trainer, valid_provider, test_provider, write: bool,
                              first_valid: int | None) -> dict:
    """The validation split (from ``first_valid``, None: the next batches), then the test
    split: {"end_validation_loss", "test_loss"}, None where the split is missing,
    --eval-iters is 0, or off the loss-owning ranks."""
    losses = {"end_validation_loss": None, "test_loss": None}
    if trainer.run.training.eval_iters <= 0:
        return losses
    if valid_provider is not None:
        losses["end_validation_loss"] = _history_value(_validate(
            trainer, valid_provider, END_OF_TRAINING[VALIDATION], True, write, first_valid))
    if test_provider is not None:
        losses["test_loss"] = _evaluate(trainer, test_provider, 0, TEST, END_OF_TRAINING[TEST],
                                        True, write)
    return losses


def evaluate_at_end(trainer, valid_provider, test_provider) -> dict:
    """The end-of-training evaluations: {"end_validation_loss", "test_loss"}
    (:func:`_evaluate_end_of_training`)."""
    return _evaluate_end_of_training(trainer, valid_provider, test_provider, write=True,
                                     first_valid=None)


SKIPPING_TRAINING = "skipping training (--skip-train is on) ..."  # Megatron-LM's line


def evaluate_only(trainer, valid_provider, test_provider) -> dict:
    """``--skip-train``: the end-of-training evaluations of the model as loaded, without a
    step: {"end_validation_loss", "test_loss"} as :func:`evaluate_at_end`'s.

    As Megatron-LM: the validation split is read from its first batch (its ``--skip-train``
    loader starts at sample 0, whatever the checkpoint consumed), the lines name the loaded
    iteration, and nothing goes to TensorBoard or wandb (Megatron-LM passes
    ``write_to_tensorboard=False``). A training run's validation at that iteration read the same
    batches when it was the run's first evaluation.
    """
    log.print_rank_0(SKIPPING_TRAINING)
    return _evaluate_end_of_training(trainer, valid_provider, test_provider, write=False,
                                     first_valid=0)

"""Values derived once from the validated flags: the padded vocabulary and the sample counts.

Several parts of a run read them (the padded vocabulary: the model and the FLOPs count; the
sample counts: the datasets), so they are derived in one place: during argument validation
(:func:`derive_run_values`) where the flags suffice, and by
:meth:`megatron.varlen_training.config.RunConfig.with_vocabulary` once a tokenizer says the
vocabulary size. Everything after validation reads them from the frozen run config.
"""

from __future__ import annotations

from megatron.varlen_training.batch_rampup import GlobalBatchSchedule


def padded_vocab_size(vocab_size: int, divisible_by: int, tp_size: int) -> int:
    """Megatron's rule: pad the vocabulary to a multiple of divisible_by * tp."""
    multiple = divisible_by * tp_size
    return -(-vocab_size // multiple) * multiple


def first_in_loop_evaluation(eval_interval: int, start_eval_at_iter: int | None = None) -> int:
    """The first iteration the loop evaluates after: the first --eval-interval multiple at or
    after --start-eval-at-iter (Megatron-LM main's flag). The one statement of the rule: the
    predicate and the count below both read it."""
    start = max(start_eval_at_iter or 1, 1)  # iterations count from 1
    return -(-start // eval_interval) * eval_interval


def evaluates_after(iteration: int, eval_interval: int,
                    start_eval_at_iter: int | None = None) -> bool:
    """Whether the loop evaluates after ``iteration`` (given validation batches): every
    --eval-interval-th iteration from :func:`first_in_loop_evaluation` on."""
    return (iteration % eval_interval == 0
            and iteration >= first_in_loop_evaluation(eval_interval, start_eval_at_iter))


def in_loop_evaluations(iteration: int, eval_interval: int,
                        start_eval_at_iter: int | None = None) -> int:
    """The in-loop evaluations up to ``iteration``: how many of 1..``iteration``
    :func:`evaluates_after` holds for (Megatron-LM main subtracts ``start // interval``
    instead, one evaluation too many when the start is itself a multiple)."""
    first = first_in_loop_evaluation(eval_interval, start_eval_at_iter)
    return 0 if iteration < first else (iteration - first) // eval_interval + 1


def sample_counts(args) -> tuple[int, int]:
    """(train, eval) samples the datasets must provide (eval: every evaluation point, or the one
    of ``--skip-train``); train is ``--train-samples`` when given, as in Megatron-LM (a last
    partial batch is never read)."""
    # A ramp-up step that starts within --train-samples may end past it (Megatron-LM's count);
    # a run resumed with another batch size reads from its anchor on (batch_rampup.py).
    last = GlobalBatchSchedule.of(args).first_sample(args.train_iters)
    train = max(args.train_samples, last) if args.train_samples is not None else last
    num_evals = 1 if getattr(args, "skip_train", False) else in_loop_evaluations(
        args.train_iters, max(args.eval_interval, 1), getattr(args, "start_eval_at_iter", None)) + 1
    return train, num_evals * max(args.eval_iters, 0) * _eval_batch_size(args)


def test_sample_count(args) -> int:
    """Samples of the test split: one evaluation of --eval-iters global batches at the end of
    training (Megatron-LM's ``test_samples``)."""
    return max(args.eval_iters, 0) * _eval_batch_size(args)


def _eval_batch_size(args) -> int:
    """--eval-global-batch-size, default --global-batch-size (Megatron-LM main's)."""
    return getattr(args, "eval_global_batch_size", None) or args.global_batch_size


def derive_run_values(args, vocab_size: int | None) -> dict:
    """The derived fields; ``padded_vocab_size`` is ``--padded-vocab-size``, else None while the
    vocabulary is unknown.
    Reads ``args`` only: validation stores them in its own copy of the namespace
    (``arguments.validate_args``), never in the one it was given."""
    train_samples, eval_samples = sample_counts(args)
    padded = args.padded_vocab_size  # --padded-vocab-size: the size exactly, as Megatron-LM
    if padded is None and vocab_size is not None:
        padded = padded_vocab_size(
            vocab_size, args.make_vocab_size_divisible_by, args.tensor_model_parallel_size)
    return {"vocab_size": vocab_size, "padded_vocab_size": padded,
            "train_samples": train_samples, "eval_samples": eval_samples,
            "test_samples": test_sample_count(args)}

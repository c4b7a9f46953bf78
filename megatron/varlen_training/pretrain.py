"""``pretrain(trainer)``: what pretrain_gpt.py and pretrain_mamba.py run -- the datasets, then
the loop of :class:`Trainer` steps with evaluation, periodic saves and the exit conditions."""

from __future__ import annotations

import time
from typing import NamedTuple

from megatron.varlen_training import checkpoint, evaluation, log, loop_steps, training
from megatron.varlen_training.batch_rampup import GlobalBatchSchedule, RampupMessages
from megatron.varlen_training.data import PackedBatchProvider, UnpackedBatchProvider
from megatron.varlen_training.datasets import documents
from megatron.varlen_training.datasets.builder import build_split_datasets
from megatron.varlen_training.datasets.truncation_report import report_truncated_rows
from megatron.varlen_training.errors import agree_on_errors, exit_on_user_errors
from megatron.varlen_training.exit_conditions import ExitConditions
from megatron.varlen_training.read_agreement import reads_can_fail
from megatron.varlen_training.step_timers import BATCH_GENERATOR, LEVEL_2
from megatron.varlen_training.trainer import Trainer
from megatron.varlen_training.validation_sets import build_validation_sets, datasets_of
from megatron.varlen_training.window_layers import counted_window


class DataProviders(NamedTuple):
    """The step-batch providers of a run's splits (None: a split that is not read)."""

    train: object
    valid: object | None
    test: object | None


def build_data_providers(trainer: Trainer) -> DataProviders:
    """The run's datasets in the step-batch providers the loop consumes. The trainer must have
    started (tokenizer, dynamic CP groups)."""
    run = trainer.run
    train_ds, valid_ds, test_ds = agree_on_errors(build_split_datasets, run, trainer.tokenizer)
    gbs, eval_gbs = run.training.global_batch_size, run.training.eval_batch_size
    # --num-workers reads indexed data (files) ahead; mock and SFT samples are in memory, and
    # evaluation jumps between iterations (each jump would restart the workers).
    workers = run.data.num_workers if run.data.indexed else 0
    eod, resets = trainer.tokenizer.eod, documents.document_resets(run.data)
    agree = reads_can_fail(run.data)  # the same flags on every rank: all agree, or none
    # --rampup-batch-size grows the training batches; evaluation reads whole global batches.
    train_schedule = GlobalBatchSchedule.of(run.training)
    if run.packing.sequence_packing:
        # --reset-attention-mask: a pretraining sample's documents are packed one by one.
        split = None if run.data.sft else documents.packed_document_split(
            resets, eod, trainer.tokenizer.pad)
        whole = run.data.full_validation  # only the validation split is built whole
        # --full-validation: the validation splits are built whole (the training and test
        # splits not); --multiple-validation-sets builds one per set
        make = lambda ds, n: PackedBatchProvider(  # noqa: E731
            ds, gbs if ds is train_ds else eval_gbs, trainer.packer(), n, split, agree,
            schedule=train_schedule if ds is train_ds else None,
            whole_split=whole and ds is not train_ds and ds is not test_ds)
    else:
        make = lambda ds, n: UnpackedBatchProvider(  # noqa: E731
            ds, gbs if ds is train_ds else eval_gbs, run.training.micro_batch_size,
            run.model.seq_length, n,
            documents.unpacked_transform(resets, eod),
            documents.unpacked_attention_lengths(resets, eod), agree,
            train_schedule if ds is train_ds else None,
            attention_window=counted_window(run.model))
    providers = DataProviders(*(make(ds, workers if ds is train_ds else 0)
                                if ds is not None else None
                                for ds in (train_ds, valid_ds, test_ds)))
    if not run.data.multiple_validation_sets:
        return providers
    if providers.valid is not None:  # the blend of every set: not evaluated
        providers.valid.close()
    return providers._replace(valid=build_validation_sets(trainer, lambda ds: make(ds, 0)))


def _save_at_end(trainer: Trainer) -> str | None:
    """The end-of-run save (unless the periodic save just wrote this iteration); its folder."""
    root, iteration = trainer.run.checkpoint.save, trainer.state.iteration
    if not loop_steps.final_save_due(trainer.run.checkpoint, iteration):
        return checkpoint.checkpoint_dir(root, iteration) if root else None
    return trainer.save()


def _exit_early(trainer: Trainer, reason: str) -> None:
    """Saves (with --save) and says in one line why the run stops before --train-iters."""
    folder = _save_at_end(trainer)
    saved = f"checkpoint {folder}; resume with --load {trainer.run.checkpoint.save}" if folder \
        else "nothing saved (no --save)"
    log.print_rank_0(f"exiting after iteration {trainer.state.iteration} of "
                     f"{trainer.run.training.train_iters}: {reason}; {saved}")


def _next_batch_size(trainer: Trainer, schedule: GlobalBatchSchedule,
                     messages: RampupMessages, last_size: int | None) -> int:
    """The samples of the next step. With --rampup-batch-size, Megatron-LM's lines about the
    size first, and (with --save) its checkpoint before the first step of a larger batch (not
    twice at one iteration: the periodic save may just have written it)."""
    for line in messages.at(trainer.state.consumed_train_samples):
        log.print_rank_0(line)
    size = schedule.size(trainer.state.iteration)
    saving = trainer.run.checkpoint  # the config (the name ``checkpoint`` is the package)
    if last_size is not None and size != last_size and saving.save \
            and not loop_steps.periodic_save_due(saving, trainer.state.iteration):
        trainer.save()
    return size


def train(trainer: Trainer, train_provider, valid_provider, exits: ExitConditions,
          test_provider=None) -> list[dict]:
    """Runs until --train-iters, or until an exit condition (--exit-signal-handler,
    --exit-interval, --exit-duration-in-mins) stops it after an iteration, saved; returns
    {"lm_loss", "grad_norm", "validation_loss"} per iteration run, the last one with the
    end-of-training "end_validation_loss" and "test_loss" unless an exit condition stopped the
    run (evaluation.py says when and on which samples each evaluation runs).

    Losses are None off the last pipeline stage (only that stage has them); validation_loss is
    None at iterations without evaluation; with --multiple-validation-sets the validation
    losses are {set name: loss} ("validation-wiki", ...).
    """
    history, train_iters, stop, last_size = [], trainer.run.training.train_iters, None, None
    rampup_messages = RampupMessages(train_provider.schedule,
                                     trainer.run.training.micro_batch_size)
    while trainer.state.iteration < train_iters and stop is None:
        start = time.perf_counter()
        size = _next_batch_size(trainer, train_provider.schedule, rampup_messages, last_size)
        last_size = size
        with trainer.step_timers.timed(BATCH_GENERATOR, LEVEL_2):
            batches = train_provider.step_batches(trainer.state.iteration)
        report = trainer.step(batches, started_at=start, num_samples=size)
        trainer.write_metrics(trainer.record(report))
        history.append({"lm_loss": report.loss, "grad_norm": report.grad_norm,
                        "validation_loss": evaluation.evaluate_in_loop(trainer, valid_provider),
                        **report.metrics.losses})
        trainer.hooks.end_iteration()  # Megatron-LM's: after the evaluation, before the save
        trainer.save_if_due()
        stop = exits.reason(trainer.state.iteration)  # every rank, every iteration: it agrees
    if stop is not None and trainer.state.iteration < train_iters:
        _exit_early(trainer, stop)  # a resumed run finishes the schedule, and exports
    else:
        _save_at_end(trainer)  # then evaluate, as Megatron-LM does
        end_losses = evaluation.evaluate_at_end(trainer, valid_provider, test_provider)
        if history:
            history[-1].update(end_losses)
        if trainer.run.checkpoint.save_hf:  # validation refused it for a family without one
            with training.params_gathered(trainer.state.model):
                trainer.family.hf.save(trainer.run, trainer.state.model)
    return history


def pretrain(trainer: Trainer) -> list[dict]:
    """Starts ``trainer`` and trains as its run says; returns {"lm_loss", "grad_norm",
    "validation_loss"} per iteration (with --skip-train one entry without a step: its
    "end_validation_loss" and "test_loss"). The caller closes the trainer (after reporting an
    error).

    The clock of --exit-duration-in-mins and the signal handling of --exit-signal-handler start
    here, before set-up: a job's wall-clock limit counts set-up too, and a SIGTERM during it
    then stops the run after its first iteration, saved, instead of killing it.
    """
    with ExitConditions.of(trainer.run.training) as exits:
        trainer.start()
        providers = build_data_providers(trainer)
        try:
            state = trainer.setup_model_and_optimizer()
            if trainer.run.training.skip_train:  # evaluate the loaded model, save nothing
                return [{"lm_loss": None, "grad_norm": None, "validation_loss": None,
                         **evaluation.evaluate_only(trainer, providers.valid, providers.test)}]
            if providers.valid is not None and state.iteration > 0 \
                    and not trainer.run.data.full_validation:  # it reads from 0 each time
                evaluation.check_resumed_validation(trainer.run.training, state.iteration,
                                                    state.consumed_valid_samples,
                                                    trainer.run.data.eval_samples)
                evaluation.continue_validation(providers.valid, state.consumed_valid_samples)
            history = train(trainer, providers.train, providers.valid, exits, providers.test)
            # Parquet/Arrow rows are tokenized when read: their truncations are counted then.
            report_truncated_rows(dataset for p in providers if p is not None
                                  for dataset in datasets_of(p))
            return history
        finally:  # --num-workers readers stop with the run, not at interpreter exit
            for provider in providers:
                if provider is not None:
                    provider.close()


def run_entry_point(prog: str, run, family) -> None:
    """What ``pretrain_gpt.py`` and ``pretrain_mamba.py`` do with their parsed run: train a
    ``family`` model through :func:`pretrain`, bad data, checkpoints and NaN ending in one line
    (``prog``'s), and close the trainer after that line (a peer that died must not hide it)."""
    trainer = Trainer(run, family)
    try:
        with exit_on_user_errors(prog):
            pretrain(trainer)
    finally:
        trainer.close()

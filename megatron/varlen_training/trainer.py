"""``Trainer``: one run's orchestration, shared by pretrain_gpt.py, pretrain_mamba.py and
``MegatronWrap``.

    trainer = Trainer(run, family).start()   # device, groups, parallel state, seeds, tokenizer,
                                             #   dynamic CP groups, metric writers
    trainer.setup_model_and_optimizer()      # the family's model, optimizer, LR schedule, --load
    report = trainer.step(batches)           # train step (non-finite guard), metrics
    trainer.write_metrics(trainer.record(report))
    trainer.save_if_due()
    trainer.close()

The entry points' loop (``pretrain.py``) adds data, evaluation and exit conditions around
:meth:`Trainer.step`; the facade feeds it the caller's batches with a flow's forward step. Both
build their metric writers here, from the run's :class:`LoggingConfig`, and write the same
records (:func:`iteration_metrics.to_json_record`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace

import torch

from megatron.core import parallel_state
from megatron.core.optimizer_param_scheduler import get_canonical_lr_for_logging
from megatron.varlen_training import checkpoint, device_memory, log, reported_losses, training
from megatron.varlen_training import theoretical_memory
from megatron.varlen_training.config import RunConfig
from megatron.varlen_training.data import build_packing_config
from megatron.varlen_training.errors import UserInputError, agree_on_errors
from megatron.varlen_training.initialize import (
    initialize_megatron, shutdown, teardown_parallel_state,
)
from megatron.varlen_training.iteration_metrics import IterationMetrics, to_json_record
from megatron.varlen_training.load_options import load_parts
from megatron.varlen_training.loop_steps import periodic_save_due
from megatron.varlen_training.metric_writers import build_metric_writers
from megatron.varlen_training.model_family import GPT, ModelFamily
from megatron.varlen_training.params_norm import params_l2_norm
from megatron.varlen_training.process_settings import apply_process_settings
from megatron.varlen_training.progress_log import ProgressLog
from megatron.varlen_training.runtime_hooks import StepHooks
from megatron.varlen_training.step_timers import StepTimers
from megatron.varlen_training.tokenizer import build_run_tokenizer, check_tokenizer_fits
from megatron.varlen.packing import GlobalBatchPacker, StepBatches
from megatron.varlen.platform import get_device, initialize_dynamic_cp_groups
from megatron.varlen.scheduling import build_group_layout


def _log_padded_vocabulary(run: RunConfig) -> None:
    """Megatron-LM's start-up line for the vocabulary padding (its ``vocab_size_with_padding``)."""
    vocab, padded = run.model.vocab_size, run.model.padded_vocab_size
    log.print_rank_0(f" > padded vocab (size: {vocab}) with {padded - vocab} dummy tokens "
                     f"(new size: {padded})")


@dataclass(frozen=True)
class StepReport:
    """One optimizer step: the reported loss (None off the last pipeline stage), the grad norm
    (None when the fp16 scaler skipped the step) and the iteration's metrics."""

    loss: float | None
    grad_norm: float | None
    metrics: IterationMetrics


def create_dynamic_cp_groups(run: RunConfig):
    """Dynamic CP: create every group the scheduler may pick; returns their lookup (or None)."""
    if not run.packing.dynamic_context_parallel:
        return None
    parallel = run.parallel
    layout = build_group_layout(parallel.dp_cp_size, run.packing.min_dynamic_context_parallel_size,
                                parallel.context_parallel_size)
    registry = initialize_dynamic_cp_groups(layout)
    log.print_rank_0(f"> dynamic context parallel: {parallel.dp_cp_size} DP x CP ranks, CP group "
                     f"sizes {list(layout.sequence_sizes)}, {registry.groups_per_rank()} process "
                     f"groups per rank ({len(layout.groups)} blocks per DP x CP group)")
    return registry.lookup


def _last_rank_writers(run: RunConfig, console: bool) -> list:
    """The metric writers on the last rank (the loss owner), [] elsewhere; a writer that cannot
    be built fails on every rank, in one line."""
    def build():
        if not log.is_last_rank():
            return []
        try:
            return build_metric_writers(run.logging, run.training.train_iters, run.flag_values,
                                        console=console,
                                        world_size=torch.distributed.get_world_size())
        except ImportError as err:  # start-up checked the packages; a broken install is left
            raise UserInputError(f"a metric writer cannot start: {err}") from err
    return agree_on_errors(build)


class Trainer:
    """A run of a model of ``family`` as ``run`` says (module docstring).

    Args:
        run: The run's configuration.
        family: The model family (GPT unless told).
        checkpoint_files: ``{name: text}`` written into every checkpoint it saves.
        console: Print Megatron-LM's iteration line through the console writer.
    """

    def __init__(self, run: RunConfig, family: ModelFamily = GPT,
                 checkpoint_files: dict[str, str] | None = None, console: bool = True):
        self.run = run
        self.family = family
        self.checkpoint_files = dict(checkpoint_files or {})
        self.console = console
        self.tokenizer = None
        self.state: training.TrainState | None = None
        self.cp_group_lookup = None
        self.writers: list = []
        self.step_timers: StepTimers | None = None
        # When Megatron-LM reports memory: its footprint lines anywhere, the memory line on CUDA.
        self._memory_reports: device_memory.MemoryReports | None = None
        self.hooks: StepHooks | None = None  # the runtime flags' work around steps
        self.progress: ProgressLog | None = None  # --log-progress with --save
        self._owns_process_group = False

    # --- start ------------------------------------------------------------------------------

    def start(self) -> Trainer:
        """Device, process group, parallel state, seeds (and the arguments dump), tokenizer and
        the run's vocabulary, dynamic CP groups, metric writers; the runtime flags' process
        settings (logging level, deterministic mode) before all that, memory history after."""
        started_at = time.time()  # the job's clock of --log-progress's job throughput
        self._owns_process_group = not torch.distributed.is_initialized()
        apply_process_settings(self.run.runtime)
        initialize_megatron(self.run)
        self.progress = ProgressLog.of(self.run, torch.distributed.get_world_size(), started_at)
        if self.progress is not None:  # where Megatron-LM writes it: after initialisation
            self.progress.job_started()
        self.hooks = StepHooks(self.run.runtime, torch.distributed.get_rank(),
                               self.run.logging.log_interval, self.run.logging.tensorboard_dir)
        self.hooks.start()  # before the model is built: its allocations are recorded
        if self.family.describe is not None:
            log.print_rank_0(self.family.describe(self.run.model))
        # Data errors (bad file, line, bytes) are one line on every rank, never a traceback.
        data = self.run.data
        log.print_rank_0(f"> building {data.tokenizer_type} tokenizer ...")  # Megatron-LM's
        self.tokenizer = agree_on_errors(build_run_tokenizer, data, self.run.model.vocab_size)
        self.run = self.run.with_vocabulary(self.tokenizer.vocab_size)
        check_tokenizer_fits(self.tokenizer, self.run.model.vocab_size, data.tokenizer_type)
        _log_padded_vocabulary(self.run)
        self.cp_group_lookup = create_dynamic_cp_groups(self.run)
        self.writers = _last_rank_writers(self.run, self.console)
        self.step_timers = StepTimers(self.run.logging, log.is_last_rank(), log.info_all_ranks)
        return self

    def packer(self, extra_token_fields: tuple[str, ...] = ()) -> GlobalBatchPacker:
        """The packing service for this run's global batches; ``extra_token_fields`` travel
        like ``loss_mask`` (a facade flow's per-token fields)."""
        config = build_packing_config(self.run, self.tokenizer.pad,
                                      self.family.attention_layers(self.run.model),
                                      extra_token_fields)
        return GlobalBatchPacker(config, group_lookup=self.cp_group_lookup)

    def setup_model_and_optimizer(self) -> training.TrainState:
        """The family's model, the optimizer and LR schedule; resumes from ``--load``."""
        self.state = training.setup_model_and_optimizer(self.run, self.family,
                                                        self.step_timers.core)
        return self.state

    # --- steps ------------------------------------------------------------------------------

    def step(self, batches: StepBatches, forward_step_func=training.forward_step,
             started_at: float | None = None, num_samples: int | None = None) -> StepReport:
        """One optimizer step on this rank's micro-batches of a global batch.

        ``started_at`` (``time.perf_counter()``): when the step's work began (its data
        included); default now. ``num_samples``: the samples of the global batch (default
        ``--global-batch-size``); the LR schedule and the consumed samples advance by it.

        Raises:
            NonFiniteLossError: With --check-for-nan-in-loss-and-grad, before the update, on
                every rank; the state stays the last good step's.
        """
        started_at = time.perf_counter() if started_at is None else started_at
        if self._memory_reports is None:
            self._memory_reports = device_memory.MemoryReports(
                self.run.logging.log_interval, self.run.logging.log_memory_interval,
                self.state.iteration)
        if self.hooks is not None:
            self.hooks.before_step(self.state.iteration)
        loss, grad_norm = training.train_step(self.run, self.state, batches,
                                              forward_step_func=forward_step_func,
                                              num_samples=num_samples)
        self.state.iteration += 1
        if self.hooks is not None:
            self.hooks.after_step(self.state.iteration)
        self.state.consumed_train_samples += training.samples_in_step(self.run, num_samples)
        metrics = self._metrics(batches, loss, grad_norm, time.perf_counter() - started_at,
                                training.samples_in_step(self.run, num_samples))
        # Every step's work counts, a step the fp16 scaler skipped too (as in Megatron-LM).
        self.state.num_floating_point_operations_so_far += metrics.flops
        line_losses, scalars = reported_losses.step_losses(self.run.model, self.run.logging,
                                                           get_device())
        metrics.losses.update(line_losses)
        metrics.scalars.update(scalars)
        if self.run.logging.log_memory_to_tensorboard:  # CUDA only (refused on CPU)
            metrics.scalars.update(device_memory.memory_scalars())
        metrics.timers.update(self.step_timers.end_step(self.state.iteration, metrics.step_time_s,
                                                        metrics.tflops_per_device))
        return StepReport(loss, grad_norm, metrics)

    def _metrics(self, batches: StepBatches, loss, grad_norm, step_time: float,
                 num_samples: int) -> IterationMetrics:
        """The step's metrics; its global batch size is the samples it trained (Megatron-LM
        logs the current global batch size)."""
        run, state = self.run, self.state
        return IterationMetrics(
            iteration=state.iteration, train_iters=run.training.train_iters,
            consumed_samples=state.consumed_train_samples, step_time_s=step_time,
            learning_rate=get_canonical_lr_for_logging(state.optimizer.param_groups),
            global_batch_size=num_samples,
            lm_loss=loss, grad_norm=grad_norm, num_microbatches=batches.num_microbatches,
            tokens=batches.seqlen_sum, seqlen_sum=batches.seqlen_sum,
            seqlen_squared_sum=batches.seqlen_squared_sum,
            flops=self.family.flops(run.model, batches.seqlen_sum, batches.seqlen_squared_sum,
                                    batches.seqlen_windowed_squared_sum),
            world_size=torch.distributed.get_world_size(), loss_scale=self._loss_scale(),
            skipped=grad_norm is None, num_zeros_in_grad=state.num_zeros_in_grad,
            params_norm=params_l2_norm(state.model, main_params=run.model.bf16)
            if run.logging.log_params_norm else None,
            extra=dict(batches.stats))

    def _loss_scale(self) -> float:
        """The fp16 loss scaler's current scale (Megatron-LM's ``loss scale``); 1 without fp16,
        read without a device round trip."""
        if not self.run.model.fp16:
            return 1.0
        return float(self.state.optimizer.get_loss_scale().item())

    @staticmethod
    def record(report: StepReport, extra_metrics: dict | None = None) -> dict:
        """The step in the one JSONL schema; ``extra_metrics`` (a flow's) follow its keys."""
        return to_json_record(report.metrics, extra_metrics)

    def write_metrics(self, record: dict) -> None:
        """Hands ``record`` to the metric writers (they exist on the last rank only)."""
        for writer in self.writers:
            writer.write(record["iteration"], record)
        self._print_memory_line(record["iteration"])

    def _print_memory_line(self, iteration: int) -> None:
        """Megatron-LM's memory reports after the iteration line: with the first ones its
        theoretical footprint (global rank 0, theoretical_memory.py); the memory line on CUDA,
        on the ranks of data-parallel rank 0 (device_memory.py)."""
        if self._memory_reports is None or not self._memory_reports.due(iteration):
            return
        if self._memory_reports.with_footprint:
            theoretical_memory.report_theoretical_memory(self.run)
        if torch.cuda.is_available() and parallel_state.get_data_parallel_rank() == 0:
            log.info_all_ranks(device_memory.memory_line(
                f"(after {iteration} iterations)", torch.distributed.get_rank(),
                self.run.logging.log_device_memory_used))

    def write_evaluation(self, name: str, loss: float,
                         metrics: dict[str, float] | None = None) -> None:
        """Hands an evaluation's loss and ``metrics`` (a flow's own, by name) to the metric
        writers (last rank), at the current iteration and consumed training samples, under
        Megatron-LM's keys (``lm loss validation``, ...: metric_writers.evaluation_key)."""
        state = self.state
        for writer in self.writers:
            writer.write_evaluation(name, loss, state.iteration, state.consumed_train_samples,
                                    metrics)

    # --- checkpoints ------------------------------------------------------------------------

    def save(self, root: str | None = None) -> str:
        """Saves the state under ``root`` (default ``--save``); returns the checkpoint folder.
        With ``--log-progress``, a save under ``--save`` adds its line to progress.txt."""
        state, root = self.state, root or self.run.checkpoint.save
        with training.params_gathered(state.model):  # --overlap-param-gather: current weights
            folder = checkpoint.save_checkpoint(
                root, state.iteration, state.model, state.optimizer,
                state.scheduler, self.run, extra_files=self.checkpoint_files,
                consumed_samples=state.consumed_train_samples,
                consumed_valid_samples=state.consumed_valid_samples,
                num_floating_point_operations_so_far=state.num_floating_point_operations_so_far)
        self._log_progress_of_save(root)
        return folder

    def _log_progress_of_save(self, root: str) -> None:
        """--log-progress: Megatron-LM's progress.txt line of a checkpoint saved under --save
        (the facade's ``save(path)`` elsewhere adds none)."""
        if self.progress is None or \
                os.path.abspath(root) != os.path.abspath(self.progress.folder):
            return
        state = self.state
        self.progress.checkpoint_saved(state.iteration, state.num_floating_point_operations_so_far,
                                       state.num_floating_point_operations_at_load,
                                       state.consumed_train_samples)

    def save_if_due(self) -> str | None:
        """``--save-interval``: saves after every multiple; the folder, or None."""
        if periodic_save_due(self.run.checkpoint, self.state.iteration):
            return self.save()
        return None

    def load(self, root: str, step: int | None = None) -> int:
        """Restores the checkpoint under ``root`` (checked against this run); its iteration.
        ``step``: that iteration (``--ckpt-step``; default the run's, else the latest)."""
        # load_parts: --finetune, --no-load-optim, --no-load-rng, --ckpt-step
        parts = load_parts(self.run.checkpoint)
        if step is not None:
            parts = replace(parts, step=step)
        return training.load_state(self.state, root, parts, self.run)

    # --- close ------------------------------------------------------------------------------

    def close(self) -> None:
        """Closes the metric writers and tears down the parallel state (and the process group
        if :meth:`start` created it)."""
        for writer in self.writers:
            writer.close()
        self.writers = []
        if self.hooks is not None:  # a profiler window cut short still writes its trace
            self.hooks.close()
            self.hooks = None
        if self._owns_process_group:
            shutdown()
        else:
            teardown_parallel_state()

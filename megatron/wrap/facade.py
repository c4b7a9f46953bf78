"""``MegatronWrap``: train a Megatron GPT on lists of variable-length samples, packing built in.

    wrap = MegatronWrap("megatron/wrap/configs/sft_tiny_cpu.yaml")
    wrap.initialize()                       # torchrun env, or an initialised process group
    wrap.setup_model_and_optimizer()
    for batch in batches:                   # batch: the GLOBAL batch, a list of sample dicts
        metrics = wrap.train(batch)         # same metrics on every rank
        wrap.log_last_metrics()
    wrap.save()

Every step runs ``pretrain_gpt.py``'s code through the same ``Trainer``: the flow converts
samples to data-path samples, DP replica r takes block r of the batch, the trainer's
``GlobalBatchPacker`` packs them (THD, static or dynamic CP, micro-batches) and
``Trainer.step`` runs the optimizer step with the flow's forward step. Packing is always on.
See docs/WRAP.md.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist

from megatron.varlen_training import checkpoint, log
from megatron.varlen_training.config import RunConfig
from megatron.varlen_training.errors import agree_and_gather, share_nothing
from megatron.varlen_training.evaluation import VALIDATION
from megatron.varlen_training.flag_errors import ArgumentValidationError
from megatron.varlen_training.hf.config import HFConfigError
from megatron.varlen_training.initialize import initialize_distributed
from megatron.varlen_training.loop_steps import eval_mode, log_validation_loss
from megatron.varlen_training.model_family import GPT
from megatron.varlen_training.process_settings import apply_deterministic_mode, joinable_backend
from megatron.varlen_training.trainer import Trainer
from megatron.varlen_training.training import (
    TrainState, params_gathered, reduce_reported_loss, run_forward_backward,
)
from megatron.wrap import batch as batching
from megatron.wrap import runtime, script_errors
from megatron.wrap.config import ConfigError, WrapConfig, build_config
from megatron.wrap.config.keys import default_known_keys
from megatron.wrap.flows import Flow, FlowContext, build_flow, ignored_fields
from megatron.wrap.forward import FlowForwardStep
from megatron.wrap.main_guard import protect_unguarded_script
from megatron.wrap.metric_writers import ProgressBar
from megatron.wrap.microbatches import pack_step, per_token_fields
from megatron.wrap.parallel import ParallelStateMixin
from megatron.wrap.pretrained import pretrained_config
from megatron.wrap.step_results import (
    LOSS,
    flow_metrics,
    memory_metrics,
    reduce_across_stages,
    train_metrics,
)

CONFIG_FILENAME = "wrap_config.yaml"  # the resolved config, stored with each checkpoint


class MegatronWrap(ParallelStateMixin):
    """The facade (module docstring). Call the methods in the order they are listed.

    Args:
        config: A YAML path or a config dict (docs/WRAP_CONFIG.md), or a built WrapConfig.
        overrides: ``["section.key=value", ...]`` or a dict, applied last.
        configs_root: Folder(s) that ``__select__`` searches (default: the shipped library).
    """

    def __init__(self, config: str | Path | Mapping | WrapConfig, overrides=None,
                 configs_root=None):
        script_errors.install_excepthook()  # uncaught user errors: one line, exit code 2
        self.config = config if isinstance(config, WrapConfig) else \
            build_config(config, overrides, configs_root)
        self.trainer: Trainer | None = None
        self.flow: Flow | None = None
        self._packer = None
        self._forward_step = None
        self._progress = None
        self._last_metrics: dict | None = None
        self._last_record: dict | None = None  # the same step in the shared JSONL schema
        self._exit_stack = contextlib.ExitStack()
        self._owns_process_group = False
        self._saved: tuple | None = None  # _save_key of the last save
        self._warned_past_train_iters = False

    @classmethod
    def from_pretrained(cls, hf_dir: str | Path, config: str | Path | Mapping | WrapConfig,
                        overrides=None, configs_root=None) -> MegatronWrap:
        """A facade whose model starts from the local Hugging Face checkpoint ``hf_dir``
        (Llama, Qwen2, Qwen3); ``config`` holds the training settings (megatron/wrap/pretrained.py).
        """
        built = config if isinstance(config, WrapConfig) else \
            build_config(config, overrides, configs_root)
        return cls(pretrained_config(built, hf_dir))

    # --- megatron-wrap's accessors (usable before initialize(), as its example.py does) -------

    def get_flow_key(self) -> str:
        """The flow's name (config key ``flow.flow_name``; megatron-wrap's ``flow_key``)."""
        return self.config.facade["flow_name"]

    def get_common_args(self) -> SimpleNamespace:
        """Every pretrain_gpt.py argument of this config as attributes (``train_iters``,
        ``save_interval``, ``global_batch_size``, ...): the config's value, else the parser's
        default. Before ``initialize()``: nothing here is derived or validated yet."""
        return SimpleNamespace(**{**default_known_keys(), **self.config.flat})

    @property
    def run(self) -> RunConfig | None:
        """The run's configuration (None before ``initialize()``)."""
        return None if self.trainer is None else self.trainer.run

    @property
    def tokenizer(self):
        """The run's tokenizer (None before ``initialize()``)."""
        return None if self.trainer is None else self.trainer.tokenizer

    @property
    def state(self) -> TrainState | None:
        """Model chunks, optimizer, LR schedule and iteration (after the model is set up)."""
        return None if self.trainer is None else self.trainer.state

    # --- set-up ---------------------------------------------------------------------------

    def initialize(self) -> MegatronWrap:
        """Process group (torchrun env, or the one already initialised), then the Trainer's
        start (parallel state, seeds, tokenizer, dynamic CP groups, metric writers), the flow,
        its packer and the logging."""
        facade = self.config.facade
        log.set_log_level(facade["log_level"])
        runtime.check_device(facade["device"])
        runtime.apply_wandb_entity(facade)
        self._owns_process_group = not dist.is_initialized()
        flat = dict(self.config.flat)
        if flat.get("deterministic_mode"):  # its variables before NCCL starts, as the CLI's
            apply_deterministic_mode()
        initialize_distributed(flat.get("distributed_timeout_minutes"),
                               backend=joinable_backend(flat.get("distributed_backend")))
        script_errors.install_excepthook()  # outside torch's, which init_process_group added
        # A flag check can fail on one rank only (a --save directory its node cannot write):
        # the ranks agree before any of them goes on to the next collective.
        run, console = agree_and_gather(
            functools.partial(runtime.run_config_of, self.config, dist.get_world_size()),
            share_nothing, kept_user_errors=(ArgumentValidationError, ConfigError))[0]
        self.trainer = Trainer(run, GPT, checkpoint_files={CONFIG_FILENAME: self.config.to_yaml()},
                               console=console)
        self.trainer.start()  # close() tears down what it set up, even if it fails midway
        protect_unguarded_script()  # save() from a script without a main guard must not hang
        limit, key = batching.length_limit(self.run)
        self.flow = build_flow(facade["flow_name"],
                               FlowContext(self.run, self.tokenizer, limit, key,
                                           ignored_fields(facade["ignored_fields"])),
                               facade["flow_args"])
        # The packer carries the flow's per-token fields like loss_mask (no re-layout here).
        self._packer = self.trainer.packer(per_token_fields(self.flow.extra_fields()))
        self._forward_step = FlowForwardStep(self.flow)
        self._setup_logging(facade)
        log.print_rank_0("%s | flow %r | longest sample %d tokens (%s)",
                         self.parallel_summary(), self.flow.name, limit, key)
        runtime.log_ignored_keys(self.config.ignored)
        return self

    def _setup_logging(self, facade: dict) -> None:
        # The line prefix reads megatron-core's parallel state, as pretrain_gpt.py's lines do.
        if facade["capture_print"]:
            self._exit_stack.enter_context(log.capture_print())
        if facade["capture_warnings"]:
            self._exit_stack.enter_context(log.capture_warnings())
        if facade["capture_print"] or facade["capture_warnings"]:
            # A script that never calls close() (megatron-wrap's example) must get print and
            # warnings back before interpreter teardown, not during it.
            atexit.register(self._exit_stack.close)
        train_iters = self.run.training.train_iters
        if facade["progress_bar"] and train_iters > 0:
            self._progress = ProgressBar(train_iters)

    def setup_model_and_optimizer(self) -> MegatronWrap:
        """Model chunks, optimizer and LR schedule (``Trainer.setup_model_and_optimizer``);
        loads the config's ``load`` checkpoint if it names one."""
        self._require(self.trainer, "initialize()")
        self.trainer.setup_model_and_optimizer()
        return self

    # --- steps ----------------------------------------------------------------------------

    def train(self, batch: Sequence[Mapping] | None, source: str | None = None) -> dict:
        """One optimizer step on the global batch ``batch``; returns its metrics on every rank.

        Args:
            batch: The global batch: a list of sample dicts in a form the flow reads.
            source: ``"all_ranks"`` (every rank passes the same batch) or ``"rank0"`` (only
                rank 0 does); default the config's ``wrap.batch_source``.

        Returns:
            ``iteration`` (completed; the number ``save()`` puts in the path), ``loss`` (global
            per-token mean), the flow's metrics, ``grad_norm``, ``lr``, ``samples``,
            ``tokens``, ``num_microbatches``, ``step_time_s``, ``tokens_per_s``,
            ``tflops_per_device``, ``padding_ratio``, ``packing_efficiency``,
            ``schedule_imbalance``.

        A step past ``train_iters`` runs (the loop is the caller's), with one warning the first
        time (docs/WRAP.md section 1).

        Raises:
            ValueError: Empty batch or a bad sample (one line, the same on every rank).
            NonFiniteLossError: A NaN/Inf loss or grad norm; the step was not applied.
        """
        self._require(self.state, "setup_model_and_optimizer()")
        self._warn_past_train_iters()
        start = time.perf_counter()
        samples = self._global_batch(batch, source, "train")
        step = pack_step(self._packer, samples, self.flow.extra_fields())
        self._forward_step.reset()
        # The LR schedule and the consumed samples advance by the samples of THIS batch.
        report = self.trainer.step(step, forward_step_func=self._forward_step, started_at=start,
                                   num_samples=len(samples))
        reduced = reduce_across_stages(report.loss, self._forward_step.records,
                                       self.flow.metric_names)
        self._last_metrics = train_metrics(report, reduced, len(samples))
        if self.config.facade["memory_metrics"]:
            self._last_metrics.update(memory_metrics())
        self._last_record = self.trainer.record(report, flow_metrics(reduced))
        folder = self.trainer.save_if_due()
        if folder is not None:
            self._saved = self._save_key(self.run.checkpoint.save)
            log.print_rank_0("saved iteration %d to %s", self.state.iteration, folder)
        return dict(self._last_metrics)

    def _warn_past_train_iters(self) -> None:
        """Megatron-LM's loop stops at train_iters; megatron-wrap's loop is the caller's, so a
        step past it runs (an RL job is not killed at its last step), with one warning: the
        LR schedule's lengths default to train_iters, past them the LR stays at min_lr."""
        iteration, train_iters = self.state.iteration + 1, self.run.training.train_iters
        if self._warned_past_train_iters or iteration <= train_iters:
            return
        self._warned_past_train_iters = True
        log.warning_rank_0(
            "train(): iteration %d is past train_iters %d, where Megatron-LM's loop stops; "
            "the step runs (lr %.6E: past its decay the LR schedule stays at min_lr, and the "
            "progress line stays full): raise training.train_iters to train longer "
            "(warned once)", iteration, train_iters, self.state.optimizer.param_groups[0]["lr"])

    @torch.no_grad()
    def evaluate(self, batch: Sequence[Mapping] | None, source: str | None = None) -> dict:
        """Forward only on ``batch``: ``loss``, the flow's metrics, ``samples``, ``tokens``,
        ``num_microbatches`` (every rank; no weight is updated; the validation samples read,
        ``state.consumed_valid_samples``, advance by the batch's). The validation line and the
        metric writers (TensorBoard / wandb: ``lm loss validation``, ``<metric> validation``)
        get them as ``pretrain_gpt.py``'s evaluations do (docs/WRAP.md section 4)."""
        self._require(self.state, "setup_model_and_optimizer()")
        samples = self._global_batch(batch, source, "evaluate")
        step = pack_step(self._packer, samples, self.flow.extra_fields())
        self._forward_step.reset()
        with eval_mode(self.state.model):
            losses = run_forward_backward(self.run, self.state, step, forward_only=True,
                                          forward_step_func=self._forward_step)
        reduced = reduce_across_stages(reduce_reported_loss(losses), self._forward_step.records,
                                       self.flow.metric_names)
        # Megatron-LM's consumed_valid_samples: checkpointed, and where a pretrain_gpt.py
        # resume of this run's checkpoint continues its validation stream.
        self.state.consumed_valid_samples += len(samples)
        log_validation_loss(self.state.iteration, reduced[LOSS])  # as pretrain_gpt.py's loop
        if self.trainer.writers:  # the last rank: TensorBoard / wandb as the loop's evaluations
            self.trainer.write_evaluation(VALIDATION, reduced[LOSS], flow_metrics(reduced))
        return {**reduced, "samples": len(samples), "tokens": step.seqlen_sum,
                "num_microbatches": step.num_microbatches}

    def _global_batch(self, batch, source: str | None, what: str) -> list[dict]:
        source = source or self.config.facade["batch_source"]
        samples = batching.global_batch(batch, self.flow, source, what)
        if not any(bool(sample["loss_mask"].any()) for sample in samples):
            log.warning_rank_0("%s(): no sample has a token to train on (loss_mask all 0): the "
                               "loss is reported as 0", what)
        return samples

    # --- logging --------------------------------------------------------------------------

    @property
    def last_metrics(self) -> dict | None:
        """The metrics of the last ``train()`` step (None before the first)."""
        return None if self._last_metrics is None else dict(self._last_metrics)

    @property
    def iteration(self) -> int:
        """Iterations completed (restored by ``load``)."""
        self._require(self.state, "setup_model_and_optimizer()")
        return self.state.iteration

    def log_last_metrics(self) -> None:
        """Writes the last step's metrics through the Trainer's metric writers (last rank:
        console/JSONL/TensorBoard/wandb, as ``logging.metric_writers`` says) and advances the
        progress line (rank 0)."""
        metrics = self._last_metrics
        if metrics is None:
            log.warning_rank_0("log_last_metrics(): no train() step yet")
            return
        self.trainer.write_metrics(self._last_record)
        if self._progress is not None:
            self._progress.update(metrics["iteration"], {LOSS: metrics[LOSS]})

    # --- checkpoints ----------------------------------------------------------------------

    def save(self, path: str | None = None) -> str:
        """Saves model, optimizer, LR schedule and iteration; returns the checkpoint folder.

        The folder is ``<root>/iter_<N>`` with N the iterations completed, the ``iteration``
        of the last ``train()`` metrics. ``root`` is ``path`` or the config's ``save``. If
        that iteration was saved there already (``save_interval``'s save after ``train()``,
        or an earlier ``save()``) and no ``evaluate()`` ran since, it is not written twice:
        Megatron-LM's loop skips its final save when the periodic one just wrote it.
        """
        self._require(self.state, "setup_model_and_optimizer()")
        root = path or self.run.checkpoint.save
        if root is None:
            raise ConfigError("save() needs a path, or the config key 'save'")
        saved = self._save_key(root)
        if self._saved == saved:
            folder = checkpoint.checkpoint_dir(root, self.state.iteration)
            log.print_rank_0("iteration %d is already saved in %s", self.state.iteration, folder)
            return folder
        folder = self.trainer.save(root)
        self._saved = saved
        log.print_rank_0("saved iteration %d to %s", self.state.iteration, folder)
        return folder

    def _save_key(self, root: str) -> tuple[str, int, int]:
        """What a save writes at this point: the folder, the iteration, and the validation
        samples read (an evaluate() after save_interval's save changes the checkpoint's
        run_args.json, so it is written again; Megatron-LM's loop evaluates before it saves)."""
        state = self.state
        return os.path.abspath(root), state.iteration, state.consumed_valid_samples

    def save_pretrained(self, out_dir: str | Path) -> str:
        """Writes the model as a Hugging Face checkpoint (config.json, safetensors) that
        ``transformers.AutoModelForCausalLM.from_pretrained`` loads, plus the tokenizer's files
        if it is a Hugging Face one. Every rank must call it; returns ``out_dir``."""
        self._require(self.state, "setup_model_and_optimizer()")
        try:
            with params_gathered(self.state.model):  # --overlap-param-gather: current weights
                return self.trainer.family.hf.save(self.run, self.state.model, str(out_dir))
        except HFConfigError as err:  # the same model on every rank: raised on every rank
            raise ConfigError(f"save_pretrained({str(out_dir)!r}): {err}") from None

    def load(self, path: str | None = None, step: int | None = None) -> int:
        """Restores a checkpoint saved by ``save()`` (or ``pretrain_gpt.py``); returns its
        iteration. ``path``: a checkpoint root, or one of its ``iter_*`` folders (that
        iteration, latest or not); default the config's ``load``, else ``save``. ``step``:
        the iteration to load from the root (Megatron-LM's ``--ckpt-step``; default the one an
        ``iter_*`` path names, else the config's ``ckpt_step``, else the latest)."""
        self._require(self.state, "setup_model_and_optimizer()")
        path = path or self.run.checkpoint.load or self.run.checkpoint.save
        if path is None:
            raise ConfigError("load() needs a path, or the config key 'load'")
        root, named = runtime.checkpoint_location(path)
        if None not in (step, named) and step != named:
            raise ConfigError(f"load({path!r}, step={step}): the path is iteration {named}; "
                              f"pass its root to load step {step}, or drop step")
        iteration = self.trainer.load(root, step if step is not None else named)
        self._saved = None  # other weights at a maybe-saved iteration: the next save writes
        log.print_rank_0("loaded iteration %d from %s", iteration, path)
        return iteration

    # --- teardown -------------------------------------------------------------------------

    def close(self) -> None:
        """Closes the metric writers, restores print/warnings and tears down the parallel
        state (and the process group if ``initialize()`` created it)."""
        if self.trainer is not None:
            self.trainer.close()  # the process group is ours, not the trainer's
        self._exit_stack.close()
        if self._owns_process_group and dist.is_initialized():
            dist.destroy_process_group()
            self._owns_process_group = False

    def __enter__(self) -> MegatronWrap:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @staticmethod
    def _require(value, step: str) -> None:
        if value is None:
            raise RuntimeError(f"call MegatronWrap.{step} first")

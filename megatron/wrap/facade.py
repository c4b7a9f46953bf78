"""``MegatronWrap``: train a Megatron GPT on lists of variable-length samples, packing built in.

    wrap = MegatronWrap("megatron/wrap/configs/sft_tiny_cpu.yaml")
    wrap.initialize()                       # torchrun env, or an initialised process group
    wrap.setup_model_and_optimizer()
    for batch in batches:                   # batch: the GLOBAL batch, a list of sample dicts
        metrics = wrap.train(batch)         # same metrics on every rank
        wrap.log_last_metrics()
    wrap.save()

Every step runs ``pretrain_gpt.py``'s code: the flow converts samples to data-path samples,
DP replica r takes block r of the batch, ``GlobalBatchPacker.pack_global_batch``
packs them (THD, static or dynamic CP, micro-batches) and ``training.train_step`` runs the
optimizer step with the flow's forward step. Packing is always on. See docs/WRAP.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from megatron.varlen_training import checkpointing
from megatron.varlen_training.data import build_packing_config
from megatron.varlen_training import log
from megatron.varlen_training.loop_steps import eval_mode, log_validation_loss, periodic_save_due
from megatron.varlen_training.initialize import (
    initialize_distributed,
    initialize_model_parallel,
    set_random_seeds,
    shutdown,
    teardown_parallel_state,
)
from megatron.varlen_training.pretrain import create_dynamic_cp_groups
from megatron.varlen_training.run_description import describe_run
from megatron.varlen_training.hf.exporter import save_hf
from megatron.varlen_training.tokenizer import build_tokenizer, check_tokenizer_fits
from megatron.varlen_training.training import (
    TrainState,
    reduce_reported_loss,
    run_forward_backward,
    setup_model_and_optimizer,
    train_step,
)
from megatron.varlen.packing import GlobalBatchPacker
from megatron.wrap import batch as batching
from megatron.wrap.metric_writers import ProgressBar
from megatron.wrap import runtime
from megatron.wrap.config import WrapConfig, build_config
from megatron.wrap.flows import Flow, FlowContext, build_flow
from megatron.wrap.forward import FlowForwardStep
from megatron.wrap.microbatches import pack_step, per_token_fields
from megatron.wrap.parallel import ParallelStateMixin
from megatron.wrap.pretrained import pretrained_config
from megatron.wrap.step_results import LOSS, reduce_across_stages, train_metrics

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
        self.config = config if isinstance(config, WrapConfig) else \
            build_config(config, overrides, configs_root)
        self.args = None
        self.tokenizer = None
        self.flow: Flow | None = None
        self.state: TrainState | None = None
        self._packer = None
        self._forward_step = None
        self._writers: list = []
        self._progress = None
        self._last_metrics: dict | None = None
        self._last_record: dict | None = None  # the same step in the shared JSONL schema
        self._exit_stack = contextlib.ExitStack()
        self._owns_process_group = False

    @classmethod
    def from_pretrained(cls, hf_dir: str | Path, config: str | Path | Mapping | WrapConfig,
                        overrides=None, configs_root=None) -> MegatronWrap:
        """A facade whose model starts from the local Hugging Face checkpoint ``hf_dir``
        (Llama, Qwen2, Qwen3); ``config`` holds the training settings (megatron/wrap/pretrained.py).
        """
        built = config if isinstance(config, WrapConfig) else \
            build_config(config, overrides, configs_root)
        return cls(pretrained_config(built, hf_dir))

    # --- set-up ---------------------------------------------------------------------------

    def initialize(self) -> MegatronWrap:
        """Process group (torchrun env, or the one already initialised), parallel state,
        seeds, tokenizer, packer, flow and logging."""
        facade = self.config.facade
        log.set_log_level(facade["log_level"])
        runtime.check_device(facade["device"])
        self._owns_process_group = not dist.is_initialized()
        initialize_distributed(dict(self.config.flat).get("distributed_timeout_minutes"))
        parsed = runtime.parse_training_args(self.config)
        self.tokenizer = build_tokenizer(parsed.tokenizer_type, parsed.vocab_size,
                                         parsed.tokenizer_model)
        args = self.args = describe_run(parsed, self.tokenizer.vocab_size)  # read-only now
        check_tokenizer_fits(self.tokenizer, args.vocab_size)
        initialize_model_parallel(args)
        set_random_seeds(args.seed)
        limit, key = batching.length_limit(args)
        self.flow = build_flow(facade["flow_name"],
                               FlowContext(args, self.tokenizer, limit, key), facade["flow_args"])
        # The packer carries the flow's per-token fields like loss_mask (no re-layout here).
        packing_config = dataclasses.replace(
            build_packing_config(args, self.tokenizer.pad),
            extra_token_fields=per_token_fields(self.flow.extra_fields()))
        self._packer = GlobalBatchPacker(packing_config,
                                         group_lookup=create_dynamic_cp_groups(args))
        self._forward_step = FlowForwardStep(self.flow)
        self._setup_logging(facade)
        log.print_rank_0("%s | flow %r | longest sample %d tokens (%s)",
                         self.parallel_summary(), self.flow.name, limit, key)
        return self

    def _setup_logging(self, facade: dict) -> None:
        # The line prefix reads megatron-core's parallel state, as pretrain_gpt.py's lines do.
        if facade["capture_print"]:
            self._exit_stack.enter_context(log.capture_print())
        if facade["capture_warnings"]:
            self._exit_stack.enter_context(log.capture_warnings())
        self._writers = runtime.build_writers(facade, dict(self.config.flat),
                                              self.args.train_iters)
        if facade["progress_bar"] and self.args.train_iters > 0:
            self._progress = ProgressBar(self.args.train_iters)

    def setup_model_and_optimizer(self) -> MegatronWrap:
        """Model chunks, optimizer and LR schedule (``training.setup_model_and_optimizer``);
        loads the config's ``load`` checkpoint if it names one."""
        self._require(self.args, "initialize()")
        self.state = setup_model_and_optimizer(self.args)
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

        Raises:
            ValueError: Empty batch or a bad sample (one line, the same on every rank).
        """
        self._require(self.state, "setup_model_and_optimizer()")
        start = time.perf_counter()
        samples = self._global_batch(batch, source, "train")
        step = pack_step(self._packer, samples, self.flow.extra_fields())
        self._forward_step.reset()
        loss, grad_norm = train_step(self.args, self.state, step,
                                     forward_step_func=self._forward_step)
        self.state.iteration += 1  # train_step raised before this on a NaN/Inf step
        reduced = reduce_across_stages(loss, self._forward_step.records, self.flow.metric_names)
        self._last_metrics, self._last_record = train_metrics(
            self.args, self.state, step, reduced, grad_norm, len(samples),
            time.perf_counter() - start)
        self._maybe_save()
        return dict(self._last_metrics)

    @torch.no_grad()
    def evaluate(self, batch: Sequence[Mapping] | None, source: str | None = None) -> dict:
        """Forward only on ``batch``: ``loss``, the flow's metrics, ``samples``, ``tokens``,
        ``num_microbatches`` (every rank; nothing is updated)."""
        self._require(self.state, "setup_model_and_optimizer()")
        samples = self._global_batch(batch, source, "evaluate")
        step = pack_step(self._packer, samples, self.flow.extra_fields())
        self._forward_step.reset()
        with eval_mode(self.state.model):
            losses = run_forward_backward(self.args, self.state, step, forward_only=True,
                                          forward_step_func=self._forward_step)
        reduced = reduce_across_stages(reduce_reported_loss(losses), self._forward_step.records,
                                       self.flow.metric_names)
        log_validation_loss(self.state.iteration, reduced[LOSS])  # as pretrain_gpt.py's loop
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
        """Writes the last step's metrics (last rank: console/JSONL/TensorBoard/wandb, as
        ``logging.metric_writers`` says) and advances the progress line (rank 0)."""
        metrics = self._last_metrics
        if metrics is None:
            log.warning_rank_0("log_last_metrics(): no train() step yet")
            return
        for writer in self._writers:
            writer.write(metrics["iteration"], self._last_record)
        if self._progress is not None:
            self._progress.update(metrics["iteration"], {LOSS: metrics[LOSS]})

    # --- checkpoints ----------------------------------------------------------------------

    def save(self, path: str | None = None) -> str:
        """Saves model, optimizer, LR schedule and iteration; returns the checkpoint folder.

        The folder is ``<root>/iter_<N>`` with N the iterations completed, the ``iteration``
        of the last ``train()`` metrics. ``root`` is ``path`` or the config's ``save``.
        """
        self._require(self.state, "setup_model_and_optimizer()")
        root = path or self.args.save
        if root is None:
            raise ValueError("save() needs a path, or the config key 'save'")
        state = self.state
        folder = checkpointing.save_checkpoint(
            root, state.iteration, state.model, state.optimizer, state.scheduler, self.args,
            extra_files={CONFIG_FILENAME: self.config.to_yaml()})
        log.print_rank_0("saved iteration %d to %s", state.iteration, folder)
        return folder

    def save_pretrained(self, out_dir: str | Path) -> str:
        """Writes the model as a Hugging Face checkpoint (config.json, safetensors) that
        ``transformers.AutoModelForCausalLM.from_pretrained`` loads, plus the tokenizer's files
        if it is a Hugging Face one. Every rank must call it; returns ``out_dir``."""
        self._require(self.state, "setup_model_and_optimizer()")
        return save_hf(self.args, self.state.model, str(out_dir))

    def load(self, path: str | None = None) -> int:
        """Restores a checkpoint saved by ``save()`` (or ``pretrain_gpt.py``); returns its
        iteration. ``path``: a checkpoint root or its latest ``iter_*`` folder; default the
        config's ``load``, else ``save``."""
        self._require(self.state, "setup_model_and_optimizer()")
        path = path or self.args.load or self.args.save
        if path is None:
            raise ValueError("load() needs a path, or the config key 'load'")
        state = self.state
        state.iteration = checkpointing.load_checkpoint(
            runtime.checkpoint_root(path), state.model, state.optimizer, state.scheduler,
            self.args)
        log.print_rank_0("loaded iteration %d from %s", state.iteration, path)
        return state.iteration

    def _maybe_save(self) -> None:
        if periodic_save_due(self.args, self.state.iteration):
            self.save()

    # --- teardown -------------------------------------------------------------------------

    def close(self) -> None:
        """Closes the metric writers, restores print/warnings and tears down the parallel
        state (and the process group if ``initialize()`` created it)."""
        for writer in self._writers:
            writer.close()
        self._writers = []
        self._exit_stack.close()
        if self._owns_process_group:
            shutdown()
        else:
            teardown_parallel_state()

    def __enter__(self) -> MegatronWrap:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @staticmethod
    def _require(value, step: str) -> None:
        if value is None:
            raise RuntimeError(f"call MegatronWrap.{step} first")

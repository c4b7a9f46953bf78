"""One training step and its parts: model and optimizer set-up, the pipeline schedule over a
step's micro-batches, the loss, the optimizer step with its non-finite guard, evaluation.
The loop around them is the Trainer's (trainer.py) and the entry points' (pretrain.py).

The loss follows megatron-core's per-token conventions: ``loss_func`` returns the micro-batch's
SUM of token losses and its token count. With ``--calculate-per-token-loss`` megatron-core divides
the gradients by the global token count (all-reduced over DP x CP in finalize_model_grads), so the
gradient is that of the global per-token mean whatever the packing or layout. Without it, each
micro-batch's mean is averaged (Megatron's classic behaviour; under static CP the mean over all
of the micro-batch's slices, see ``loss_func``). The REPORTED lm loss is always
the global per-token mean: sum of token losses / loss tokens over the whole global batch.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import torch

from megatron.core import parallel_state
from megatron.core.optimizer import OptimizerConfig as CoreOptimizerConfig
from megatron.core.optimizer import (
    ParamKey, get_megatron_optimizer, get_standard_config_overrides,
)
from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.utils import get_attr_wrapped_model
from megatron.varlen_training import checkpoint, log, optimizer_kernels
from megatron.varlen_training.config import RunConfig
from megatron.varlen_training.grad_finalize import finalize_model_grads_on_device
from megatron.varlen_training.load_options import checkpoint_source, fresh_start_note
from megatron.varlen_training.loop_steps import eval_mode
from megatron.varlen_training.ddp_settings import aligned_param_gather
from megatron.varlen_training.model import params_dtype
from megatron.varlen_training.model_family import GPT, ModelFamily
from megatron.varlen_training.nonfinite import check_finite
from megatron.varlen_training.runtime_hooks import empty_unused_memory
from megatron.varlen_training.sgd_state import install_sgd_state_init
from megatron.varlen_training.step_timers import (
    CLIP_MAIN_GRAD, COUNT_ZEROS, LEVEL_1, OPTIMIZER, timed,
)
from megatron.varlen.platform import get_device, gloo_cuda

LOSS_KEY = "lm loss"
# megatron-core's mark of the weights --decoupled-lr applies to (the word embeddings on the
# first stage, the output layer on the last; its LanguageModule sets it).
DECOUPLED_LR_ATTRIBUTE = "is_embedding_or_output_parameter"


@dataclass
class TrainState:
    """Everything the loop carries between iterations."""

    model: list
    optimizer: object
    scheduler: OptimizerParamScheduler
    config: object
    iteration: int = 0
    # Training samples the steps so far consumed (Megatron-LM's ``consumed_train_samples``):
    # iteration x --global-batch-size in pretrain_gpt.py's loop; the facade's runtime batches
    # may hold any number of samples, and this counts them (checkpointed in run_args.json).
    consumed_train_samples: int = 0
    # Validation samples the evaluations so far read (Megatron-LM's ``consumed_valid_samples``,
    # checkpointed in run_args.json): the next evaluation continues the stream there.
    consumed_valid_samples: int = 0
    # The floating-point operations of the steps so far, from their real sample lengths
    # (Megatron-LM's ``num_floating_point_operations_so_far``, checkpointed under its key), and
    # those the run had when it was loaded (a job's own are the difference: --log-progress).
    num_floating_point_operations_so_far: int = 0
    num_floating_point_operations_at_load: int = 0
    # --log-num-zeros-in-grad: the zero entries of the last step's clipped main grads (None
    # without the flag, or when the fp16 loss scaler skipped the step).
    num_zeros_in_grad: int | None = None


def core_optimizer_config(run: RunConfig, timers=None) -> CoreOptimizerConfig:
    """megatron-core's optimizer config of ``run``: Adam, clipping, precision, the fp16 loss
    scaler, the zero count; ``timers`` (--timing-log-level >= 1) times its phases, with a
    barrier before each level-1 timer unless --no-barrier-with-level-1-timing."""
    adam, precision = run.optimizer, run.model
    return CoreOptimizerConfig(
        optimizer=adam.optimizer, sgd_momentum=adam.sgd_momentum,
        apply_wd_to_qk_layernorm=adam.apply_wd_to_qk_layernorm, lr=adam.lr, min_lr=adam.min_lr,
        weight_decay=adam.weight_decay,
        adam_beta1=adam.adam_beta1, adam_beta2=adam.adam_beta2, adam_eps=adam.adam_eps,
        clip_grad=adam.clip_grad, bf16=precision.bf16, fp16=precision.fp16,
        params_dtype=params_dtype(precision),  # the model's (float16 with --fp16)
        use_distributed_optimizer=adam.use_distributed_optimizer,
        log_num_zeros_in_grad=run.logging.log_num_zeros_in_grad,
        loss_scale=adam.loss_scale, initial_loss_scale=adam.initial_loss_scale,
        min_loss_scale=adam.min_loss_scale, loss_scale_window=adam.loss_scale_window,
        hysteresis=adam.hysteresis,
        # get_megatron_optimizer gives the embedding and output weights their own param group
        # with these as its max_lr/min_lr, which the scheduler follows (None: the main ones).
        decoupled_lr=adam.decoupled_lr, decoupled_min_lr=adam.decoupled_min_lr,
        timers=timers, barrier_with_L1_time=run.logging.barrier_with_L1_time,
    )


def param_group_overrides(config: CoreOptimizerConfig) -> dict:
    """megatron-core's standard param groups (no weight decay on biases and 1-D weights; with
    --decoupled-lr the embedding and output weights on their own max/min LR), the decoupled
    group marked ``is_decoupled_lr``.

    Why the mark: megatron-core 0.16.1 finds a checkpoint's param groups by (wd_mult, lr_mult,
    is_expert_parallel, is_decoupled_lr) when it loads them, but leaves ``is_decoupled_lr``
    False, so the decoupled group and the main one collide and every resume fails (measured:
    ``loaded state dict contains a parameter group that doesn't match the size of optimizer's
    group``). The mark is only a key here: the schedule reads ``max_lr``/``min_lr``.
    """
    overrides = get_standard_config_overrides(config)
    if config.decoupled_lr is not None:
        key = ParamKey(attr=DECOUPLED_LR_ATTRIBUTE)
        overrides[key] = {**overrides[key], "is_decoupled_lr": True}
    return overrides


def build_optimizer(run: RunConfig, model, timers=None):
    """megatron-core's optimizer, with device-side grad norm and copies (optimizer_kernels.py)
    and, on CUDA, torch's fused AdamW."""
    optimizer_kernels.install()
    config = core_optimizer_config(run, timers)
    optimizer = get_megatron_optimizer(config, model,
                                       config_overrides=param_group_overrides(config))
    optimizer_kernels.use_fused_adam(optimizer)
    install_sgd_state_init(optimizer)  # so that an SGD run resumes (sgd_state.py)
    return optimizer


def build_scheduler(run: RunConfig, optimizer) -> OptimizerParamScheduler:
    """LR schedule counted in samples, as Megatron does (lengths resolved from iterations or
    samples by schedule_arguments.py); :func:`train_step` advances it by the samples a step
    consumed."""
    schedule = run.optimizer
    if schedule.lr_decay_iters is None:  # sample-based: Megatron-LM's line, from its scheduler
        log.print_rank_0(f"setting training iterations to {run.training.train_iters}")
    return OptimizerParamScheduler(
        optimizer, init_lr=schedule.lr_warmup_init, max_lr=schedule.lr, min_lr=schedule.min_lr,
        lr_warmup_steps=schedule.lr_warmup_steps, lr_decay_steps=schedule.lr_decay_steps,
        lr_decay_style=schedule.lr_decay_style, start_wd=schedule.start_wd,
        end_wd=schedule.end_wd, wd_incr_steps=schedule.wd_incr_steps,
        wd_incr_style=schedule.weight_decay_incr_style,
        wsd_decay_steps=schedule.wsd_decay_steps, lr_wsd_decay_style=schedule.lr_wsd_decay_style,
        # Mismatches were already refused in one line (schedule_check.check_scheduler).
        override_opt_param_scheduler=schedule.override_opt_param_scheduler,
        use_checkpoint_opt_param_scheduler=not schedule.override_opt_param_scheduler,
    )


def setup_model_and_optimizer(run: RunConfig, family: ModelFamily = GPT,
                              timers=None) -> TrainState:
    """The model of ``family`` (its provider builds the chunks), optimizer and LR schedule;
    resumes from ``--load``. ``timers``: megatron-core's (step_timers.py), or None."""
    config, model = family.model_provider(run)
    config.timers = timers  # megatron-core's schedules and finalize_model_grads time with it
    config.barrier_with_L1_time = run.logging.barrier_with_L1_time
    gloo_cuda.install()  # before the first gradient reduction (CUDA ranks over gloo)
    optimizer = build_optimizer(run, model, timers)
    scheduler = build_scheduler(run, optimizer)
    config.finalize_model_grads_func = finalize_model_grads_on_device
    config.grad_scale_func = optimizer.scale_loss
    config.no_sync_func = _per_chunk([chunk.no_sync for chunk in model])
    set_overlap_hooks(run, config, model)
    state = TrainState(model=model, optimizer=optimizer, scheduler=scheduler, config=config)
    source = checkpoint_source(run.checkpoint)
    if source is not None:
        load_state(state, *source, run)
    elif (note := fresh_start_note(run.checkpoint)) is not None:
        log.print_rank_0(f" > {note}")
    return state


def load_state(state: TrainState, root: str, parts, run: RunConfig) -> int:
    """Restores the checkpoint under ``root`` into ``state`` (what ``parts`` names: weights,
    optimizer, schedule, RNG) and the data positions the run continues from (training and
    validation samples consumed) and floating-point operations; its iteration.
    pretrain_gpt.py's start-up and the facade's ``Trainer.load`` both come here, so both build
    the same optimizer after a resume."""
    bounds = _lr_bounds(state.optimizer)
    state.iteration, flops = checkpoint.load_checkpoint(root, state.model, state.optimizer,
                                                        state.scheduler, run, parts)
    state.num_floating_point_operations_so_far = flops
    state.num_floating_point_operations_at_load = flops
    if run.optimizer.override_opt_param_scheduler:
        _set_lr_bounds(state.optimizer, bounds)
    # The loaded param groups bring the flags they were saved with: a checkpoint written by a
    # CPU run (or before fused Adam) would otherwise resume on torch's foreach kernel on CUDA.
    optimizer_kernels.use_fused_adam(state.optimizer)
    state.consumed_train_samples = checkpoint.consumed_samples_at(root, state.iteration, run)
    state.consumed_valid_samples = checkpoint.consumed_valid_samples_at(
        root, state.iteration, run)
    return state.iteration


def _lr_bounds(optimizer) -> list[tuple[float, float]]:
    """Each param group's peak and final LR (``max_lr``, ``min_lr``: megatron-core's scheduler
    reads them from the group, --decoupled-lr's group has its own)."""
    return [(group.get("max_lr"), group.get("min_lr")) for group in optimizer.param_groups]


def _set_lr_bounds(optimizer, bounds: list[tuple[float, float]]) -> None:
    """--override-opt_param-scheduler: this run's LR bounds win. Loading the optimizer state
    restores the checkpoint's param groups, bounds included (megatron-core orders them as this
    run's), so without this the scheduler would follow the old --lr/--decoupled-lr while its
    own state says the new ones."""
    for group, (max_lr, min_lr) in zip(optimizer.param_groups, bounds, strict=True):
        if max_lr is not None:
            group["max_lr"], group["min_lr"] = max_lr, min_lr


def _per_chunk(functions: list):
    """megatron-core's schedules take one function per model chunk, or one without VPP."""
    return functions[0] if len(functions) == 1 else functions


def set_overlap_hooks(run: RunConfig, config, model) -> None:
    """The schedule's hooks for ``--overlap-grad-reduce`` / ``--overlap-param-gather``, set as
    Megatron-LM sets them: with overlapped reduction the pipeline schedules start each chunk's
    gradient reduction when its last backward is done (``grad_sync_func``); with overlapped
    gathers under VPP they start each chunk's parameter all-gather before its first forward
    (``param_sync_func``, aligned across stages). Without VPP DDP's forward pre-hooks gather on
    demand. Without overlap every reduction runs in ``finalize_model_grads``."""
    parallel = run.parallel
    if parallel.overlap_grad_reduce and parallel.align_grad_reduce:
        config.grad_sync_func = _per_chunk([chunk.start_grad_sync for chunk in model])
    if parallel.overlap_param_gather and aligned_param_gather(run):
        config.param_sync_func = _per_chunk([chunk.start_param_sync for chunk in model])


@contextmanager
def params_gathered(model):
    """With ``--overlap-param-gather`` the weights of a rank are current only once its next
    forward has gathered them: for a save, an evaluation or an export, gather them now (DDP's
    forward pre-hooks off, a synchronous all-gather), and turn the hooks back on afterwards, as
    Megatron-LM does around its saves and evaluations."""
    hooked = [chunk for chunk in model if getattr(chunk, "use_forward_hook", False)]
    for chunk in hooked:
        chunk.disable_forward_pre_hook(param_sync=True)
    try:
        yield
    finally:
        for chunk in hooked:
            chunk.enable_forward_pre_hook()


def loss_func(loss_mask: torch.Tensor, output: torch.Tensor, cp_group=None):
    """megatron-core's 3-value convention: (sum of masked token losses, token count, report).

    With --calculate-per-token-loss the schedule keeps the sum and finalize_model_grads divides
    by the global token count; otherwise the schedule divides each micro-batch by its own count
    (clamped at 1: an all-masked micro-batch contributes 0, never NaN) and by the number of
    micro-batches.

    ``cp_group`` (unpacked static CP without --calculate-per-token-loss): this rank holds a
    slice of the micro-batch, and DDP averages the gradients over DP x CP. megatron-core would
    divide the slice's sum by the slice's own count -- a mean of per-slice means, wrong whenever
    the slices hold different numbers of loss tokens (SFT masks, padding; Megatron-LM issue
    7452) -- so the count returned is the whole micro-batch's (summed over the group) and the
    sum is scaled by the group size, which the DP x CP average divides out again: the gradient
    of the micro-batch's mean, as on one rank. The report keeps the slice's own sum and count.
    """
    losses = output.float().reshape(-1)
    mask = loss_mask.float().reshape(-1)
    loss_sum = torch.sum(losses * mask)
    num_tokens = mask.sum().to(torch.int)
    report = torch.stack([loss_sum.detach().clone(), num_tokens.detach().float()])
    if cp_group is not None:
        micro_batch_tokens = num_tokens.clone()
        torch.distributed.all_reduce(micro_batch_tokens, group=cp_group)
        return loss_sum * cp_group.size(), micro_batch_tokens, {LOSS_KEY: report}
    return loss_sum, num_tokens, {LOSS_KEY: report}


def _mean_loss_cp_group(model, batch: dict):
    """The CP group whose ranks share this micro-batch's per-micro-batch mean loss: only for
    an unpacked micro-batch under static CP without --calculate-per-token-loss (packing implies
    per-token loss), else None."""
    if batch.get("packed_seq_params") is not None:
        return None
    if get_attr_wrapped_model(model, "config").calculate_per_token_loss:
        return None
    group = parallel_state.get_context_parallel_group()
    return group if group.size() > 1 else None


def forward_step(data_iterator, model):
    """One micro-batch through one model chunk (megatron-core's forward_step_func)."""
    batch = next(data_iterator)
    output = model(
        batch["tokens"], batch["position_ids"], batch.get("attention_mask"), labels=batch["labels"],
        packed_seq_params=batch.get("packed_seq_params"), loss_mask=batch["loss_mask"],
        padding_mask=batch.get("padding_mask"),  # MoE routing: packed and unpacked batches
    )
    return output, partial(_micro_batch_loss, model, batch)


def _micro_batch_loss(model, batch: dict, output: torch.Tensor):
    """``loss_func`` on the micro-batch, with its CP group when the mean loss needs it
    (resolved when the schedule computes the loss: only the last stage does)."""
    return loss_func(batch["loss_mask"], output, cp_group=_mean_loss_cp_group(model, batch))


def reported_totals(losses_reduced: list[dict]) -> torch.Tensor | None:
    """[sum of token losses, loss tokens] over micro-batches and DP x CP (float64); None off
    the last PP stage."""
    if not parallel_state.is_pipeline_last_stage(ignore_virtual=True):
        return None
    total = torch.zeros(2, dtype=torch.float64, device=get_device())
    for item in losses_reduced:
        total += item[LOSS_KEY].to(torch.float64)
    torch.distributed.all_reduce(
        total, group=parallel_state.get_data_parallel_group(with_context_parallel=True))
    return total


def _per_token_mean(totals: torch.Tensor) -> float:
    """sum / tokens (an all-masked batch reports 0, never NaN)."""
    return (totals[0] / totals[1].clamp(min=1)).item()


def reduce_reported_loss(losses_reduced: list[dict]) -> float | None:
    """Global per-token mean over micro-batches and DP x CP; None off the last PP stage."""
    totals = reported_totals(losses_reduced)
    return None if totals is None else _per_token_mean(totals)


def _p2p_seq_length(run: RunConfig) -> int:
    """Full sequence length megatron-core derives fixed p2p shapes from (it divides by CP/SP).

    Fixed-shape packs hold --max-seqlen-per-dp-cp-rank tokens per rank; with variable shapes
    the value is not used.
    """
    if run.packing.sequence_packing:
        return run.packing.max_seqlen_per_dp_cp_rank * run.parallel.context_parallel_size
    return run.model.seq_length


def run_forward_backward(run: RunConfig, state: TrainState, step, forward_only: bool,
                         forward_step_func=forward_step) -> list[dict]:
    """megatron-core's pipeline schedule over ``step``'s micro-batches (one iterator per chunk)."""
    iterators = [iter(step.microbatches) for _ in state.model]
    return get_forward_backward_func()(
        forward_step_func=forward_step_func,
        data_iterator=iterators if len(iterators) > 1 else iterators[0],
        model=state.model if len(state.model) > 1 else state.model[0],
        num_microbatches=step.num_microbatches,
        seq_length=_p2p_seq_length(run),
        micro_batch_size=run.training.micro_batch_size,
        forward_only=forward_only,
    )


def train_step(run: RunConfig, state: TrainState, step, forward_step_func=forward_step,
               num_samples: int | None = None) -> tuple[float | None, float | None]:
    """One optimizer step over one global batch; returns (reported loss, grad norm). The grad
    norm is None when the fp16 loss scaler skipped the update: the LR schedule then stays.

    ``forward_step_func`` lets callers (megatron.wrap flows) bring their own inputs and loss;
    it must follow megatron-core's contract and report ``{"lm loss": [sum, tokens]}``.
    ``num_samples``: the samples in the global batch (default ``--global-batch-size``; the
    facade's runtime batches hold any number); the LR schedule advances by it.

    Raises:
        NonFiniteLossError: With --check-for-nan-in-loss-and-grad, on every rank when the loss
            or the grad norm is NaN/Inf; raised BEFORE the update, so weights, optimizer state
            (Adam moments, step counters) and the LR schedule are those of the last good step.
    """
    for chunk in state.model:
        chunk.zero_grad_buffer()
    state.optimizer.zero_grad()
    losses = run_forward_backward(run, state, step, forward_only=False,
                                  forward_step_func=forward_step_func)
    empty_unused_memory(run.runtime, level=1)  # --empty-unused-memory-level, Megatron-LM's points
    loss = reduce_reported_loss(losses)
    guard = run.training.check_for_nan_in_loss_and_grad
    with timed(getattr(state.config, "timers", None), OPTIMIZER, LEVEL_1,
               barrier=run.logging.barrier_with_L1_time):
        grad_norm, state.num_zeros_in_grad = optimizer_step(
            state.optimizer, lambda norm: _guard(guard, state, loss, norm))
    if grad_norm is not None:
        # The step consumed its global batch's samples, however many micro-batches packing made
        # of them: megatron-core's scheduler counts samples (Megatron-LM's increment, the
        # samples of the step: micro-batches x micro-batch size x DP). As in Megatron-LM only an
        # applied update advances it: a step the fp16 loss scaler skipped (no grad norm) keeps
        # the learning rate and weight decay of the step it replaces.
        state.scheduler.step(increment=samples_in_step(run, num_samples))
    empty_unused_memory(run.runtime, level=2)
    return loss, grad_norm


def samples_in_step(run: RunConfig, num_samples: int | None) -> int:
    """The samples one step trains: ``num_samples`` if given, else ``--global-batch-size``."""
    return run.training.global_batch_size if num_samples is None else num_samples


def _guard(enabled: bool, state: TrainState, loss: float | None,
           grad_norm: float | None) -> None:
    """The non-finite guard of the step about to become iteration ``state.iteration + 1``."""
    if enabled:
        check_finite(state.iteration + 1, loss, grad_norm)


def _clip_grads(optimizer, grad_norm: float) -> None:
    """Clips each inner optimizer's main grads by the total norm, as ChainedOptimizer.step does
    (each with its own --clip-grad; stub optimizers and ones without parameters skipped)."""
    for inner in optimizer_kernels.chained_optimizers(optimizer):
        if getattr(inner, "is_stub_optimizer", False) or inner.config.clip_grad <= 0.0:
            continue
        params = inner.get_parameters()
        if params:
            clip_grad_by_total_norm_fp32(
                params, max_norm=inner.config.clip_grad, total_norm=grad_norm,
                use_decoupled_grad=inner.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8)


@torch.no_grad()  # as megatron-core's step: clipping scales the grads in place
def optimizer_step(optimizer, check=None) -> tuple[float | None, int | None]:
    """megatron-core's ``optimizer.step()`` in its own order, with a decision point between the
    grad norm and the update; returns the grad norm and, with ``--log-num-zeros-in-grad``, the
    zero count of the clipped main grads (megatron-core's ``count_zeros``, as its step counts
    them between clipping and the update; else None).

    The order is ChainedOptimizer.step's (what get_megatron_optimizer returns here): main grads
    made ready (``prepare_grads``: copies, fp16 unscaling), the total grad norm, clipping by it,
    then ``step_with_ready_grads`` (the inner Adam step, the main->model param copy and the
    distributed optimizer's param all-gather). ``check(grad_norm)`` runs after the norm and
    before anything is written: if it raises, no weight, Adam moment, step counter or main
    param has changed.

    An fp16 loss-scale overflow (``prepare_grads`` finds Inf/NaN in the scaled grads) skips the
    update as megatron-core does (its loss scaler backs off); the grad norm and the zero count
    are then None.
    """
    if optimizer.prepare_grads():
        if check is not None:
            check(None)  # every rank still joins the guard's all-reduce
        return None, None
    timers = getattr(optimizer.config, "timers", None)
    barrier = getattr(optimizer.config, "barrier_with_L1_time", False)
    with timed(timers, CLIP_MAIN_GRAD, LEVEL_1, barrier=barrier):  # megatron-core's step: both
        grad_norm = optimizer.get_grad_norm()
        if check is not None:
            check(grad_norm)
        _clip_grads(optimizer, grad_norm)
    num_zeros = None
    if optimizer.config.log_num_zeros_in_grad:
        with timed(timers, COUNT_ZEROS, LEVEL_1, barrier=barrier):
            num_zeros = int(optimizer.count_zeros())
    optimizer.step_with_ready_grads()
    return grad_norm, num_zeros


@contextmanager
def _untimed(config):
    """No timers during evaluation, as Megatron-LM's ``evaluate`` (its forward-only schedules
    would otherwise add to the training interval's ``forward-backward``)."""
    timers = getattr(config, "timers", None)
    if timers is None:
        yield
        return
    config.timers = None
    try:
        yield
    finally:
        config.timers = timers


@torch.no_grad()
def evaluate(run: RunConfig, state: TrainState, provider, first_index: int,
             on_batch=None, num_batches: int | None = None) -> float | None:
    """The loss over ``num_batches`` (default --eval-iters) global batches of ``provider``
    from ``first_index`` on, forward only, the model in eval mode; None off the last pipeline
    stage.

    As Megatron-LM's ``evaluate``: the token losses and the loss tokens of all the batches are
    summed first and divided once (not a mean of the batches' means, which would weigh a token
    of a batch with few loss tokens more). ``on_batch(i)`` runs before the i-th batch (1-based;
    the progress lines of the end-of-training evaluations).
    """
    total = None
    with params_gathered(state.model), eval_mode(state.model), _untimed(state.config):
        for offset in range(run.training.eval_iters if num_batches is None else num_batches):
            if on_batch is not None:
                on_batch(offset + 1)
            step = provider.step_batches(first_index + offset)
            totals = reported_totals(run_forward_backward(run, state, step, forward_only=True))
            empty_unused_memory(run.runtime, level=1)
            if totals is not None:
                total = totals if total is None else total + totals
    return None if total is None else _per_token_mean(total)

"""Megatron-LM's sample-based schedule flags, its warm-up start, WSD and weight-decay ramp
flags, and the one resolution of both kinds of schedule.

``--train-samples``, ``--lr-warmup-samples``, ``--lr-decay-samples`` and
``--lr-warmup-fraction`` with Megatron-LM's semantics:

- A run is iteration-based (``--train-iters``, ``--lr-warmup-iters``, ``--lr-decay-iters``) or
  sample-based (``--train-samples``, ``--lr-warmup-samples``, ``--lr-decay-samples``), never a
  mix; exactly one of ``--train-iters`` / ``--train-samples`` is given.
- A sample-based run takes ``--train-samples // --global-batch-size`` iterations (the
  incomplete last batch is not trained); its decay length defaults to ``--train-samples``.
- ``--lr-warmup-fraction F`` (either kind): the warm-up is ``F x`` the decay length; it
  excludes ``--lr-warmup-iters`` / ``--lr-warmup-samples``.

megatron-core's ``OptimizerParamScheduler`` counts samples. :func:`validate_schedule` resolves
either kind into its three lengths, stored under Megatron-LM's names for them
(``lr_warmup_steps``, ``lr_decay_steps``, ``wd_incr_steps``, all in samples; the optimizer
config carries them), and ``--train-iters``. Every optimizer step advances the scheduler by the
samples it consumed, ``--global-batch-size``, however many micro-batches packing made of them
(``training.train_step``), so a packed run follows the same LR curve as an unpacked one.

The rest of Megatron-LM's schedule flags, its semantics and defaults (megatron-core's scheduler
computes the curves):

- ``--lr-warmup-init``: the warm-up starts from this learning rate (default 0).
- ``--lr-decay-style WSD``: warm-up, then ``--lr`` held, then an anneal over the last
  ``--lr-wsd-decay-iters`` (or ``--lr-wsd-decay-samples``) of the decay length, shaped by
  ``--lr-wsd-decay-style``. Megatron-LM ignores the WSD flags with another style and fails
  with an assertion without the length; both are one-line refusals here.
- ``--weight-decay-incr-style linear|cosine`` ramps the weight decay from
  ``--start-weight-decay`` to ``--end-weight-decay`` over the run (``--train-iters`` or
  ``--train-samples``); ``constant`` (the default) keeps ``--weight-decay`` and takes neither.

Megatron-LM's ``--rampup-batch-size START INCREMENT SAMPLES`` (sample-based runs only) grows
the global batch from START to ``--global-batch-size`` in steps of INCREMENT over the first
SAMPLES samples, with ``--decrease-batch-size-if-needed`` rounding a size down to a multiple of
``--micro-batch-size`` x DP (batch_rampup.py has the rules); ``--train-iters`` follows
Megatron-LM's count of the ramp's steps. Every step's LR increment, consumed samples and logged
``global batch size`` are its own batch's samples. Main's ``--step-batch-size-schedule`` is
refused in one line.
"""

from __future__ import annotations

from megatron.varlen_training.batch_rampup import MAX_RAMPUP_STEPS, GlobalBatchSchedule
from megatron.varlen_training.resumed_batch_anchor import resumed_batch_anchor

WSD = "WSD"
WSD_DECAY_STYLES = ("exponential", "linear", "cosine", "minus_sqrt")
WEIGHT_DECAY_INCR_STYLES = ("constant", "linear", "cosine")


def add_schedule_args(parser) -> None:
    group = parser.add_argument_group("sample-based schedule")
    group.add_argument("--train-samples", type=int, default=None,
                       help="Train on this many samples instead of --train-iters: "
                            "--train-samples // --global-batch-size iterations.")
    group.add_argument("--lr-warmup-samples", type=int, default=0,
                       help="Linear warm-up over this many samples (with --train-samples).")
    group.add_argument("--lr-decay-samples", type=int, default=None,
                       help="Decay the learning rate over this many samples (with "
                            "--train-samples). Default: --train-samples.")
    group.add_argument("--lr-warmup-fraction", type=float, default=None,
                       help="Warm-up as a fraction of the decay length (--lr-decay-iters or "
                            "--lr-decay-samples); replaces --lr-warmup-iters/-samples.")
    _add_shape_args(parser)


def _add_shape_args(parser) -> None:
    group = parser.add_argument_group("learning-rate and weight-decay curves")
    group.add_argument("--lr-warmup-init", type=float, default=0.0,
                       help="The learning rate the linear warm-up starts from.")
    group.add_argument("--lr-wsd-decay-style", default="exponential", choices=WSD_DECAY_STYLES,
                       help="Shape of the anneal at the end of --lr-decay-style WSD.")
    group.add_argument("--lr-wsd-decay-iters", type=int, default=None,
                       help="Iterations of the WSD anneal (the end of the decay length).")
    group.add_argument("--lr-wsd-decay-samples", type=int, default=None,
                       help="Samples of the WSD anneal (with --train-samples).")
    group.add_argument("--start-weight-decay", type=float, default=None,
                       help="Weight decay at the start (--weight-decay-incr-style linear/cosine).")
    group.add_argument("--end-weight-decay", type=float, default=None,
                       help="Weight decay at the end (--weight-decay-incr-style linear/cosine).")
    group.add_argument("--rampup-batch-size", nargs=3, type=int, default=None,
                       metavar=("START", "INCREMENT", "SAMPLES"),
                       help="Grow the global batch from START to --global-batch-size in "
                            "steps of INCREMENT over the first SAMPLES samples (with "
                            "--train-samples).")
    group.add_argument("--decrease-batch-size-if-needed", action="store_true",
                       help="With --rampup-batch-size: round a ramp-up batch size down to a "
                            "multiple of --micro-batch-size x data-parallel size instead of "
                            "refusing it.")
    group.add_argument("--step-batch-size-schedule", default=None, metavar="SCHEDULE",
                       help="Megatron-LM main's batch size by tokens seen ('0:16 2.4B:320 ...'): "
                            "not supported (refused; the global batch size is fixed).")
    group.add_argument("--weight-decay-incr-style", default="constant",
                       choices=WEIGHT_DECAY_INCR_STYLES,
                       help="Weight decay over the run: constant (--weight-decay), or from "
                            "--start-weight-decay to --end-weight-decay.")


def validate_schedule(args, require) -> None:
    """Checks the schedule flags (Megatron-LM's exclusions) and resolves ``train_iters`` and
    the scheduler's lengths in samples; needs the resolved ``global_batch_size``."""
    require(args.step_batch_size_schedule is None,
            f"--step-batch-size-schedule {args.step_batch_size_schedule!r} is not supported: "
            f"every step trains one global batch of --global-batch-size "
            f"{args.global_batch_size} samples (drop the flag)")
    require(args.train_iters is not None or args.train_samples is not None,
            "the run's length is missing: give --train-iters or --train-samples")
    require(args.train_iters is None or args.train_samples is None,
            f"give only one of --train-iters {args.train_iters} and --train-samples "
            f"{args.train_samples} (iteration- or sample-based training)")
    _validate_rampup(args, require)
    # A resume with another --global-batch-size continues at the checkpoint's samples: the
    # iteration count and the datasets' sample counts follow (resumed_batch_anchor.py).
    args.global_batch_anchor = resumed_batch_anchor(args)
    if args.train_samples is not None:
        _resolve_sample_based(args, require)
    else:
        _resolve_iteration_based(args, require)
    _validate_rampup_sizes(args, require)
    _resolve_wsd(args, require)
    _resolve_weight_decay(args, require)
    require(args.lr_warmup_init <= args.lr,
            f"--lr-warmup-init {args.lr_warmup_init} exceeds --lr {args.lr} (the warm-up rises "
            f"from --lr-warmup-init to --lr; lower --lr-warmup-init)")


def _resolve_wsd(args, require) -> None:
    """``wsd_decay_steps``: the WSD anneal in samples (None without WSD)."""
    iters, samples = args.lr_wsd_decay_iters, args.lr_wsd_decay_samples
    sample_based = args.train_samples is not None
    given, flag = (samples, "--lr-wsd-decay-samples") if sample_based \
        else (iters, "--lr-wsd-decay-iters")
    other, other_flag = (iters, "--lr-wsd-decay-iters") if sample_based \
        else (samples, "--lr-wsd-decay-samples")
    require(other is None, f"{other_flag} does not go with "
                           f"{'sample' if sample_based else 'iteration'}-based training (use "
                           f"{flag})")
    if args.lr_decay_style != WSD:
        require(given is None, f"{flag} {given} needs --lr-decay-style {WSD} (it is "
                               f"{args.lr_decay_style})")
        args.wsd_decay_steps = None
        return
    require(given is not None, f"--lr-decay-style {WSD} needs {flag} (the length of its "
                               f"anneal at the end of the decay)")
    args.wsd_decay_steps = given if sample_based else given * args.global_batch_size
    require(args.wsd_decay_steps <= args.lr_decay_steps,
            f"{flag} {given} exceeds the decay length "
            f"{args.lr_decay_steps if sample_based else args.lr_decay_iters} (the anneal is "
            f"its end; lower {flag})")


def _resolve_weight_decay(args, require) -> None:
    """``start_wd``/``end_wd`` (megatron-core's names) as Megatron-LM resolves its
    ``--start-weight-decay``/``--end-weight-decay``: both ``--weight-decay`` for the constant
    style, both given (start <= end) otherwise. The flags keep their values as given, so the
    namespace validates again."""
    given = {"--start-weight-decay": args.start_weight_decay,
             "--end-weight-decay": args.end_weight_decay}
    style = args.weight_decay_incr_style
    if style == "constant":
        for flag, value in given.items():
            require(value is None, f"{flag} {value} needs --weight-decay-incr-style linear or "
                                   f"cosine (constant keeps --weight-decay)")
        args.start_wd = args.end_wd = args.weight_decay
        return
    for flag, value in given.items():
        require(value is not None, f"--weight-decay-incr-style {style} needs {flag}")
    require(args.start_weight_decay <= args.end_weight_decay,
            f"--start-weight-decay {args.start_weight_decay} exceeds --end-weight-decay "
            f"{args.end_weight_decay} (megatron-core's weight decay only increases)")
    args.start_wd, args.end_wd = args.start_weight_decay, args.end_weight_decay


def _resolve_warmup(args, require, warmup: int, unit_samples: int, names: tuple[str, str]
                    ) -> None:
    """``lr_warmup_steps`` from ``--lr-warmup-fraction`` or the warm-up flag's value
    ``warmup`` (in units of ``unit_samples`` samples); it must end before the decay does
    (megatron-core asserts it). ``names``: the warm-up and decay flags, for the message."""
    decay_units = args.lr_decay_steps // unit_samples
    if args.lr_warmup_fraction is not None:
        args.lr_warmup_steps = args.lr_warmup_fraction * args.lr_decay_steps
        return
    require(warmup == 0 or warmup < decay_units,
            f"{names[0]} {warmup} must be smaller than the decay length {decay_units} "
            f"({names[1]})")
    args.lr_warmup_steps = warmup * unit_samples


def _refuse_other_kind(args, require, kind: str, flags: dict) -> None:
    for flag, given in flags.items():
        require(not given, f"{flag} does not go with {kind} training (use the flags of one "
                           "kind: --train-iters/--lr-warmup-iters/--lr-decay-iters or "
                           "--train-samples/--lr-warmup-samples/--lr-decay-samples)")
    require(args.lr_warmup_fraction is None or not (args.lr_warmup_iters
                                                    or args.lr_warmup_samples),
            "give only one of --lr-warmup-fraction and --lr-warmup-iters/--lr-warmup-samples")


def _resolve_sample_based(args, require) -> None:
    _refuse_other_kind(args, require, "sample-based (--train-samples)", {
        "--lr-decay-iters": args.lr_decay_iters is not None,
        "--lr-warmup-iters": args.lr_warmup_iters != 0})
    gbs = args.global_batch_size
    # (a ramp-up's first step starts at sample 0 whatever --train-samples is)
    require(args.train_samples >= gbs or args.rampup_batch_size is not None,
            f"--train-samples {args.train_samples} is less than one global batch "
            f"(--global-batch-size {gbs}): no step would run (raise --train-samples)")
    # Megatron-LM: the partial last batch is dropped; the ramp-up's steps counted its way.
    args.train_iters = GlobalBatchSchedule.of(args).train_iters(args.train_samples)
    if args.lr_decay_samples is None:
        args.lr_decay_samples = args.train_samples
    args.lr_decay_steps = args.lr_decay_samples
    args.wd_incr_steps = args.train_samples
    _resolve_warmup(args, require, args.lr_warmup_samples, 1,
                    ("--lr-warmup-samples", "--lr-decay-samples, default --train-samples"))


def _resolve_iteration_based(args, require) -> None:
    _refuse_other_kind(args, require, "iteration-based (--train-iters)", {
        "--lr-decay-samples": args.lr_decay_samples is not None,
        "--lr-warmup-samples": args.lr_warmup_samples != 0})
    gbs = args.global_batch_size
    if args.lr_decay_iters is None:
        args.lr_decay_iters = args.train_iters
    args.lr_decay_steps = args.lr_decay_iters * gbs
    args.wd_incr_steps = args.train_iters * gbs
    _resolve_warmup(args, require, args.lr_warmup_iters, gbs,
                    ("--lr-warmup-iters", "--lr-decay-iters, default --train-iters"))


def _rampup_text(args) -> str:
    return "--rampup-batch-size " + " ".join(str(v) for v in args.rampup_batch_size)


def _validate_rampup(args, require) -> None:
    """Megatron-LM's ramp-up rules (its assertions and megatron-core's), each a one-line
    refusal; every size the run reaches is checked now, not when the loop gets there."""
    if args.rampup_batch_size is None:
        require(not args.decrease_batch_size_if_needed,
                "--decrease-batch-size-if-needed needs --rampup-batch-size (here "
                "--global-batch-size itself must be divisible by --micro-batch-size x "
                "data-parallel size; drop the flag)")
        return
    text, gbs = _rampup_text(args), args.global_batch_size
    start, increment, _ = args.rampup_batch_size  # each >= 1 (flag_ranges.py)
    require(args.train_samples is not None,
            f"{text} needs sample-based training: give --train-samples instead of "
            f"--train-iters {args.train_iters} (Megatron-LM: no batch-size ramp-up for "
            f"iteration-based training)")
    require(start < gbs, f"{text}: START {start} must be less than --global-batch-size {gbs} "
                         f"(the size it ramps up to; lower START or drop the flag)")
    require((gbs - start) % increment == 0,
            f"{text}: --global-batch-size {gbs} - START {start} = {gbs - start} is not "
            f"divisible by INCREMENT {increment} (change INCREMENT or START)")
    require(not args.decrease_batch_size_if_needed or start >= _micro_times_dp(args),
            f"{text}: START {start} rounds down to no samples with "
            f"--decrease-batch-size-if-needed (it must be at least {_multiple(args)})")
    smallest = start // _micro_times_dp(args) * _micro_times_dp(args) \
        if args.decrease_batch_size_if_needed else start
    require(args.rampup_batch_size[2] // smallest <= MAX_RAMPUP_STEPS,
            f"{text}: up to {args.rampup_batch_size[2] // smallest} ramp-up steps of at least "
            f"{smallest} samples, more than {MAX_RAMPUP_STEPS} (raise START or lower SAMPLES)")


def _micro_times_dp(args) -> int:
    return args.micro_batch_size * args.data_parallel_size


def _multiple(args) -> str:
    return (f"--micro-batch-size {args.micro_batch_size} x data-parallel size "
            f"{args.data_parallel_size} = {_micro_times_dp(args)}")


def _validate_rampup_sizes(args, require) -> None:
    """Without --decrease-batch-size-if-needed every ramp-up size the run trains splits into
    whole micro-batches on every DP rank (megatron-core asserts it when the loop gets there)."""
    if args.rampup_batch_size is None or args.decrease_batch_size_if_needed:
        return
    text, micro_times_dp = _rampup_text(args), _micro_times_dp(args)
    for size in GlobalBatchSchedule.of(args).ramp_sizes(args.train_iters):
        require(size % micro_times_dp == 0,
                f"{text}: the ramp-up's global batch size {size} is not divisible by "
                f"{_multiple(args)} (change START/INCREMENT or pass "
                f"--decrease-batch-size-if-needed)")

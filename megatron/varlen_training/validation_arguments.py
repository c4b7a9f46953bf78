"""Megatron-LM's evaluation, exit-signal and initialisation flags beyond the loop's own
(``--eval-interval`` / ``--eval-iters`` in arguments.py, the exit conditions in
reliability_arguments.py): honoured, accepted where Megatron-LM reads them nowhere, or refused
in one line with the reason.

Honoured:

- ``--skip-train``: no training step; the model (from ``--load``, else as initialised) is
  evaluated on the validation and test splits, as Megatron-LM's end-of-training evaluations,
  and the run exits with code 0, writing nothing (:mod:`.evaluation`). As Megatron-LM,
  ``--no-load-optim`` is turned on with its warning.
- ``--full-validation``: each validation reads the whole validation split (one pass, from its
  first sample, the last global batch partial), not ``--eval-iters`` batches; packed runs on
  SFT files or indexed data (mock data has no split of its own). The test split keeps
  ``--eval-iters`` batches, as in Megatron-LM.
- ``--multiple-validation-sets`` (with ``--validation-set-names``, Megatron-LM main): each
  ``--valid-data-path`` entry evaluated alone, read whole (:mod:`.validation_sets`).
- ``--start-eval-at-iter N`` (Megatron-LM main): in-loop evaluations only from iteration N on;
  the validation split is built for the evaluations left (:mod:`.run_description`).
- ``--exit-signal SIG``: the signal ``--exit-signal-handler`` catches instead of SIGTERM
  (SIGINT, Ctrl-C, is caught as well, as always here; :mod:`.exit_conditions`).
- ``--encoder-seq-length N``: Megatron-LM's old spelling of ``--seq-length`` (its
  validate_args copies one into the other); both at different values are refused.
- ``--eval-global-batch-size`` (Megatron-LM main): the samples of one evaluation batch (the
  validation and test splits are built for it); ``--eval-micro-batch-size`` only at
  ``--micro-batch-size`` (with packing a micro-batch is one pack).

Accepted, no effect: ``--exit-signal-handler-for-dataloader`` (a field of Megatron-LM's
TrainingConfig that its code reads nowhere: its loader workers install the handler under
``--exit-signal-handler``; ours, the ``--num-workers`` readers of
:mod:`.datasets.sample_reader`, fork from the process that installed it and keep it, so the
exit signal sent to every process of a job leaves them reading).

Refused unless at Megatron-LM's neutral value (:data:`REFUSED_FLAGS`):
``--decoder-seq-length`` and ``--data-parallel-random-init`` (each with its reason).
"""

from __future__ import annotations

import argparse
import signal

from megatron.varlen_training.log import warning_rank_0
from megatron.varlen_training.refused_flags import SWITCH, FlagRow, add_flag_rows, refuse_given

# Megatron-LM's validate_args turns --no-load-optim on under --skip-train, with this warning.
NO_LOAD_OPTIM_WARNING = "enabling --no-load-optim when skipping training."
DEFAULT_EXIT_SIGNAL = signal.SIGTERM  # Megatron-LM's --exit-signal default
# Python cannot install a handler for these (the kernel never delivers them to the process).
UNCATCHABLE_SIGNALS = (signal.SIGKILL, signal.SIGSTOP)

# Megatron-LM draws DP rank r's weights from seed + 10 r and then broadcasts DP rank 0's, so
# the flag leaves each DP rank its own random stream (dropout) only.
_RANDOM_INIT_WHY = (
    "here weights are drawn per parameter name (layout_invariant_init.py) and the random "
    "streams do not depend on the data-parallel rank, which keeps DP, packed and dynamic-CP "
    "runs equal to the one-rank run; Megatron-LM's flag would give each DP rank its own "
    "dropout stream")
REFUSED_FLAGS = (
    FlagRow(("--decoder-seq-length",), {"type": int}, None,
            "the decoder length of Megatron-LM's encoder-decoder models; a GPT's length is "
            "--seq-length"),
    FlagRow(("--data-parallel-random-init",), SWITCH, False, _RANDOM_INIT_WHY),
)


def signal_by_name(name: str) -> signal.Signals:
    """``--exit-signal``'s type: a signal name as Megatron-LM spells its choices (SIGUSR1)."""
    try:
        return signal.Signals[name]
    except KeyError:
        raise argparse.ArgumentTypeError(
            f"{name!r} is not a signal name (e.g. SIGTERM, SIGUSR1)") from None


SPELLINGS_GIVEN = "_seq_length_spellings"  # parse-time record, dropped by validation


class SeqLengthSpellings(argparse.Action):
    """``--seq-length`` and its old spelling ``--encoder-seq-length`` (one dest): both given at
    different values is an error, where Megatron-LM's validate_args asserts."""

    def __call__(self, parser, namespace, values, option_string=None):
        seen = vars(namespace).setdefault(SPELLINGS_GIVEN, {})
        seen[option_string] = values
        if len(set(seen.values())) > 1:
            parser.error(" and ".join(f"{flag} {value}" for flag, value in seen.items())
                         + " contradict each other: --encoder-seq-length is Megatron-LM's old "
                           "spelling of --seq-length; give one")
        setattr(namespace, self.dest, values)


def add_validation_args(parser: argparse.ArgumentParser) -> None:
    """Registers the flags of the module docstring."""
    group = parser.add_argument_group("evaluation and exit signal (Megatron-LM)")
    group.add_argument("--skip-train", action="store_true",
                       help="No training: evaluate the model (from --load) on the validation "
                            "and test splits, as at the end of training, and exit; nothing is "
                            "saved (turns --no-load-optim on).")
    group.add_argument("--full-validation", action="store_true",
                       help="Each validation covers the whole validation split (with "
                            "--sequence-packing, on SFT files or indexed data), not --eval-iters "
                            "batches; the test split keeps --eval-iters.")
    group.add_argument("--multiple-validation-sets", action="store_true",
                       help="Evaluate each --valid-data-path entry alone (no weights), with its "
                            "own lines and keys (needs --full-validation, as Megatron-LM).")
    group.add_argument("--validation-set-names", nargs="+", default=None, metavar="NAME",
                       help="The sets' names in their lines and keys (default their index).")
    group.add_argument("--start-eval-at-iter", type=int, default=None,
                       help="No in-loop evaluation before this iteration (the end-of-training "
                            "ones stay); Megatron-LM main's.")
    group.add_argument("--exit-signal", type=signal_by_name, default=DEFAULT_EXIT_SIGNAL,
                       metavar="SIGNAL",
                       help="The signal --exit-signal-handler catches (a name: SIGTERM, "
                            "SIGUSR1, ...); SIGINT is caught as well.")
    group.add_argument("--exit-signal-handler-for-dataloader", action="store_true",
                       help="Accepted, no effect: Megatron-LM reads it nowhere (its loader "
                            "workers, like ours, follow --exit-signal-handler).")
    group.add_argument("--eval-global-batch-size", type=int, default=None,
                       help="Samples of one evaluation batch, validation and test (default "
                            "--global-batch-size); the loss is the per-token mean over the "
                            "samples read, whatever their batches.")
    group.add_argument("--eval-micro-batch-size", type=int, default=None,
                       help="Accepted at --micro-batch-size (the default; with "
                            "--sequence-packing a micro-batch is one pack); other values "
                            "refused.")
    add_flag_rows(parser.add_argument_group("Megatron-LM evaluation and init flags refused "
                                            "here"), REFUSED_FLAGS)


def validate_validation_args(args: argparse.Namespace, require) -> None:
    """Refuses what this run cannot do (``require(cond, message)``); resolves --skip-train's
    --no-load-optim and the evaluation batch sizes as Megatron-LM does."""
    vars(args).pop(SPELLINGS_GIVEN, None)
    refuse_given(args, REFUSED_FLAGS, require)
    _validate_eval_batch_sizes(args, require)
    require(args.exit_signal not in UNCATCHABLE_SIGNALS,
            f"--exit-signal {args.exit_signal.name} cannot be caught by a process; choose "
            f"another (SIGTERM, SIGUSR1, ...)")
    require(args.exit_signal == DEFAULT_EXIT_SIGNAL or args.exit_signal_handler,
            f"--exit-signal {args.exit_signal.name} is read only with --exit-signal-handler; "
            f"add it")
    _validate_full_validation(args, require)
    _validate_validation_sets(args, require)
    require(not (args.skip_train and args.save_hf),
            "--skip-train writes nothing (as Megatron-LM's), so --save-hf would export nothing; "
            "drop one of them")
    if args.skip_train and not args.no_load_optim:
        args.no_load_optim = True
        warning_rank_0(NO_LOAD_OPTIM_WARNING)


def _validate_full_validation(args: argparse.Namespace, require) -> None:
    """--full-validation's data: a validation split of its own, packed (a last, partial
    global batch is split unevenly over DP, which only the packing path schedules)."""
    if not args.full_validation:
        return
    require(args.eval_iters > 0,
            "--full-validation with --eval-iters 0: --eval-iters 0 turns evaluation off here; "
            "give --eval-iters K (the test split's batches)")
    require(args.sequence_packing,
            "--full-validation needs --sequence-packing: the whole validation split ends in a "
            "partial global batch, which only the packing path spreads over DP ranks")
    require(not args.mock_data,
            "--full-validation with --mock-data: mock data has no validation split of its own "
            "to cover; use --eval-iters, or real data")
    require(args.packing_unit != "document",
            "--full-validation with --packing-unit document: its datasets have no validation "
            "split; drop one of them")


def _validate_eval_batch_sizes(args: argparse.Namespace, require) -> None:
    """--eval-global-batch-size / --eval-micro-batch-size, default the training values
    (Megatron-LM main's). The evaluation's micro-batches are the training ones: with packing one
    pack each, unpacked the size the pipeline's p2p shapes are built for."""
    given = args.eval_micro_batch_size
    require(given is None or given == args.micro_batch_size,
            f"--eval-micro-batch-size {given} differs from --micro-batch-size "
            f"{args.micro_batch_size}: evaluation runs the training micro-batches here (with "
            f"--sequence-packing one pack each); drop --eval-micro-batch-size")
    args.eval_micro_batch_size = args.micro_batch_size
    if args.eval_global_batch_size is None:
        args.eval_global_batch_size = args.global_batch_size
    micro_times_dp = args.micro_batch_size * args.data_parallel_size
    require(args.eval_global_batch_size % micro_times_dp == 0,
            f"--eval-global-batch-size {args.eval_global_batch_size} is not divisible by "
            f"--micro-batch-size {args.micro_batch_size} x data-parallel size "
            f"{args.data_parallel_size}")


def _is_weight(entry: str) -> bool:
    try:
        float(entry)
    except ValueError:
        return False
    return True


def _validate_validation_sets(args: argparse.Namespace, require) -> None:
    """--multiple-validation-sets: Megatron-LM main's rules (each set whole, no weights, one
    name per set)."""
    names, paths = args.validation_set_names, args.valid_data_path
    require(names is None or args.multiple_validation_sets,
            "--validation-set-names needs --multiple-validation-sets")
    if not args.multiple_validation_sets:
        return
    require(args.full_validation,
            "--multiple-validation-sets needs --full-validation: each set is read whole, as "
            "Megatron-LM requires")
    require(bool(paths), "--multiple-validation-sets needs --valid-data-path PREFIX [PREFIX "
                         "...]: one validation set per entry")
    require(not any(_is_weight(entry) for entry in paths),
            f"--multiple-validation-sets with a weighted --valid-data-path "
            f"{' '.join(paths)}: each set is evaluated alone; list the prefixes without weights")
    require(names is None or len(names) == len(paths),
            f"--validation-set-names gives {len(names or ())} names for {len(paths)} "
            f"--valid-data-path sets; give one per set")
    if names is not None:
        args.validation_set_names = tuple(names)

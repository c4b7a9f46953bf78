"""Megatron-LM's checkpoint-format and save-mode flags: what this fork does with each.

- ``--ckpt-format``: ``torch_dist`` (Megatron-LM's default) is the one format written and read;
  Megatron-LM's others are refused in one line (:mod:`.checkpoint.format`).
- ``--auto-detect-ckpt-format``: accepted; a load always detects the folder's format, and one
  in another format is refused in one line naming it.
- ``--ckpt-step N``: load iteration N from ``--load`` instead of the latest (the tracker file is
  then not read); a missing iteration is one line listing those saved.
- ``--exit-on-missing-checkpoint``: a ``--load`` that holds no checkpoint stops the run (one
  line) also when it is the ``--save`` folder. Without it, that one case (Megatron-LM's
  restartable job, ``--save`` and ``--load`` the same folder, at its first launch) starts from
  scratch with a line saying so (Megatron-LM's behaviour); a ``--load`` elsewhere that holds no
  checkpoint always stops the run, so a mistyped source never trains from scratch.
- Refused in one line, with the way out: ``--async-save`` (saves are synchronous: a save is
  published, verified and named latest before training goes on),
  ``--non-persistent-save-interval`` / ``--non-persistent-ckpt-type`` (every save is a
  persistent checkpoint: use ``--save-interval``).
- ``--use-checkpoint-args``: the model flags come from the loaded checkpoint's ``run_args.json``
  (:mod:`checkpoint_model_flags`, applied while the command line is parsed), the tokenizer
  too unless ``--no-use-tokenizer-model-from-checkpoint-args``.
"""

from __future__ import annotations

from megatron.varlen_training.load_options import OTHER_FORMATS, SUPPORTED_FORMAT

NON_PERSISTENT_TYPES = ("global", "local", "in_memory")  # Megatron-LM's choices


def add_checkpoint_args(parser) -> None:
    group = parser.add_argument_group("checkpoint format")
    group.add_argument("--ckpt-format", default=SUPPORTED_FORMAT,
                       choices=(SUPPORTED_FORMAT, *OTHER_FORMATS),
                       help=f"Checkpoint format; only {SUPPORTED_FORMAT} (megatron-core "
                            f"dist_checkpointing) is written and read, the others are refused.")
    group.add_argument("--auto-detect-ckpt-format", action="store_true",
                       help="Accepted: a load always detects the checkpoint's format and "
                            "refuses one it cannot read in one line.")
    group.add_argument("--ckpt-step", type=int, default=None,
                       help="Load this iteration from --load instead of the latest one (the "
                            "tracker file is not read).")
    group.add_argument("--exit-on-missing-checkpoint", action="store_true",
                       help="Stop also when --load is the --save folder and holds no "
                            "checkpoint yet (else that run starts from scratch; a --load "
                            "elsewhere holding none always stops the run).")
    group.add_argument("--async-save", action="store_true",
                       help="Refused: saves are synchronous here.")
    group.add_argument("--non-persistent-save-interval", type=int, default=None,
                       help="Refused: every save is a persistent checkpoint (--save-interval).")
    group.add_argument("--non-persistent-ckpt-type", default=None, choices=NON_PERSISTENT_TYPES,
                       help="Refused with --non-persistent-save-interval.")
    group.add_argument("--use-checkpoint-args", action="store_true",
                       help="Take the model flags from the checkpoint being loaded (--load, "
                            "else --pretrained-checkpoint; --ckpt-step's iteration): its sizes "
                            "are defaults the command line may set, its other model flags "
                            "override the command line's, as in Megatron-LM.")
    group.add_argument("--no-use-tokenizer-model-from-checkpoint-args",
                       "--disable-use-tokenizer-model-from-checkpoint-args",
                       action="store_false", dest="use_tokenizer_model_from_checkpoint_args",
                       help="With --use-checkpoint-args: keep the command line's "
                            "--tokenizer-type and --tokenizer-model instead of the "
                            "checkpoint's (its tokenizer file may lie elsewhere here).")


def validate_checkpoint_args(args, require) -> None:
    require(args.ckpt_format == SUPPORTED_FORMAT,
            f"--ckpt-format {args.ckpt_format} is not supported: this fork writes and reads "
            f"megatron-core's {SUPPORTED_FORMAT} checkpoints only; use --ckpt-format "
            f"{SUPPORTED_FORMAT}")
    require(not args.async_save,
            "--async-save is not supported: saves here are synchronous (each checkpoint is "
            "published and verified before training goes on); remove --async-save")
    for flag, value in (("--non-persistent-save-interval", args.non_persistent_save_interval),
                        ("--non-persistent-ckpt-type", args.non_persistent_ckpt_type)):
        require(value is None,
                f"{flag} {value} is not supported: every save here is a persistent "
                f"checkpoint; use --save-interval instead")
    require(args.ckpt_step is None or args.load is not None
            or args.pretrained_checkpoint is not None,
            f"--ckpt-step {args.ckpt_step} says which iteration to load, but there is nothing "
            f"to load (pass --load)")

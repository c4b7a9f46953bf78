"""Pretrain (or fine-tune) a GPT model with Megatron's flags, on GPU/NCCL or CPU/gloo.

    torchrun --nproc-per-node 4 pretrain_gpt.py --num-layers 2 --hidden-size 64 ... --mock-data

Thin on purpose: parse into the run's config, train it through the Trainer, tear down. See
megatron/varlen_training/ for the pieces.

Light to import on purpose: megatron-core's first checkpoint save starts a helper process with
multiprocessing's 'spawn' method, which runs this file again (as ``__mp_main__``) before the
save can go on. torch and megatron-core are therefore imported inside ``main()``, so that
helper starts in about 0.1 s instead of several seconds per rank
(tests/unit_tests/test_entry_point_imports.py).
"""

from megatron.varlen_training.log import capture_warnings
from megatron.varlen_training.warning_filters import silence_known_warnings

silence_known_warnings()  # before megatron.core is imported (it warns at import time)

PROG = "pretrain_gpt.py"


@capture_warnings()  # warnings become rank-prefixed log lines, like every other line
def main(argv=None) -> None:
    from megatron.varlen_training.config.from_flags import parse_run_config_or_exit
    from megatron.varlen_training.process_group import peers_joined_at_start_up
    from megatron.varlen_training.process_settings import apply_before_join

    # The flags before megatron-core is imported: a bad one is reported seconds sooner.
    run = parse_run_config_or_exit(argv, prog=PROG)
    apply_before_join(run.runtime)  # --deterministic-mode's variables before NCCL starts
    # A launcher's other ranks meet here, before that import too: a bad start-up on any rank
    # ends every rank at once, in its one line.
    with peers_joined_at_start_up(PROG, run.parallel.distributed_timeout_minutes,
                                  run.parallel.distributed_backend):
        from megatron.varlen_training.model_family import GPT
        from megatron.varlen_training.pretrain import run_entry_point

        run_entry_point(PROG, run, GPT)


if __name__ == "__main__":  # dist_checkpointing spawns processes: keep the guard
    main()

"""Pretrain (or fine-tune) a hybrid Mamba-Transformer with Megatron's flags, GPU/NCCL or CPU/gloo.

    torchrun --nproc-per-node 4 pretrain_mamba.py --hybrid-layer-pattern M*-M*- \
        --hidden-size 64 --num-attention-heads 4 --mamba-head-dim 16 --mamba-num-groups 2 ...

The same Trainer, loop, data path, packing, schedulers, checkpointing and metrics as
pretrain_gpt.py; only the model family differs (``HYBRID``,
megatron/varlen_training/hybrid_model.py). Light to import for the same reason as
pretrain_gpt.py (megatron-core's first save re-runs this file in a 'spawn' helper): torch and
megatron-core are imported inside ``main()``.
"""

from megatron.varlen_training.log import capture_warnings
from megatron.varlen_training.warning_filters import silence_known_warnings

silence_known_warnings()  # before megatron.core is imported (it warns at import time)

PROG = "pretrain_mamba.py"


@capture_warnings()  # warnings become rank-prefixed log lines, like every other line
def main(argv=None) -> None:
    from megatron.varlen_training.config.from_flags import parse_hybrid_run_config_or_exit
    from megatron.varlen_training.process_group import peers_joined_at_start_up
    from megatron.varlen_training.process_settings import apply_before_join

    # The flags before megatron-core is imported: a bad one is reported seconds sooner.
    run = parse_hybrid_run_config_or_exit(argv)
    apply_before_join(run.runtime)  # --deterministic-mode's variables before NCCL starts
    # A launcher's other ranks meet here, before that import too: a bad start-up on any rank
    # ends every rank at once, in its one line.
    with peers_joined_at_start_up(PROG, run.parallel.distributed_timeout_minutes,
                                  run.parallel.distributed_backend):
        from megatron.varlen_training.hybrid_model import HYBRID
        from megatron.varlen_training.pretrain import run_entry_point

        run_entry_point(PROG, run, HYBRID)


if __name__ == "__main__":  # dist_checkpointing spawns processes: keep the guard
    main()

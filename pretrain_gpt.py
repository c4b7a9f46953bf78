"""Pretrain (or fine-tune) a GPT model with Megatron's flags, on GPU/NCCL or CPU/gloo.

    torchrun --nproc-per-node 4 pretrain_gpt.py --num-layers 2 --hidden-size 64 ... --mock-data

Thin on purpose: parse, initialise, train, tear down. See megatron/varlen_training/ for the pieces.
"""

from megatron.varlen_training.warning_filters import silence_known_warnings

silence_known_warnings()  # before megatron.core is imported (it warns at import time)

from megatron.varlen_training.config.from_flags import parse_run_config_or_exit  # noqa: E402
from megatron.varlen_training.errors import exit_on_user_errors  # noqa: E402
from megatron.varlen_training.initialize import initialize_megatron, shutdown  # noqa: E402
from megatron.varlen_training.log import capture_warnings  # noqa: E402
from megatron.varlen_training.pretrain import pretrain  # noqa: E402


@capture_warnings()  # warnings become rank-prefixed log lines, like every other line
def main(argv=None) -> None:
    run = parse_run_config_or_exit(argv)
    initialize_megatron(run)
    try:
        with exit_on_user_errors("pretrain_gpt.py"):  # bad data, checkpoint, NaN: one line
            pretrain(run)
    finally:
        shutdown()


if __name__ == "__main__":  # dist_checkpointing spawns processes: keep the guard
    main()

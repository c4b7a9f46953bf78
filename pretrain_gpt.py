"""Pretrain (or fine-tune) a GPT model with Megatron's flags, on GPU/NCCL or CPU/gloo.

    torchrun --nproc-per-node 4 pretrain_gpt.py --num-layers 2 --hidden-size 64 ... --mock-data

Thin on purpose: parse into the run's config, train it through the Trainer, tear down. See
megatron/varlen_training/ for the pieces.
"""

from megatron.varlen_training.warning_filters import silence_known_warnings

silence_known_warnings()  # before megatron.core is imported (it warns at import time)

from megatron.varlen_training.config.from_flags import parse_run_config_or_exit  # noqa: E402
from megatron.varlen_training.errors import exit_on_user_errors  # noqa: E402
from megatron.varlen_training.log import capture_warnings  # noqa: E402
from megatron.varlen_training.model_family import GPT  # noqa: E402
from megatron.varlen_training.pretrain import pretrain  # noqa: E402
from megatron.varlen_training.trainer import Trainer  # noqa: E402

PROG = "pretrain_gpt.py"


@capture_warnings()  # warnings become rank-prefixed log lines, like every other line
def main(argv=None) -> None:
    trainer = Trainer(parse_run_config_or_exit(argv, prog=PROG), GPT)
    try:
        with exit_on_user_errors(PROG):  # bad data, checkpoint, NaN: one line
            pretrain(trainer)
    finally:
        trainer.close()  # after the error line: a peer that died must not hide it


if __name__ == "__main__":  # dist_checkpointing spawns processes: keep the guard
    main()

"""The config builders: the validated argparse namespace -> :class:`RunConfig`, once.

The only functions under megatron/ that take the namespace are these and the flag layer's own
parsers and validators (arguments.py and its flag groups); a test holds that line
(tests/unit_tests/varlen_training/test_config.py). Validation has resolved every default and
derived value by now; the builders copy, and each component checks its own ranges.
"""

from __future__ import annotations

from megatron.varlen_training.arguments import exit_on_flag_errors, parse_args
from megatron.varlen_training.config.checkpoint import CheckpointConfig
from megatron.varlen_training.config.data import DataConfig
from megatron.varlen_training.config.kernels import KernelConfig
from megatron.varlen_training.config.logging import LoggingConfig
from megatron.varlen_training.config.mla import MLAConfig
from megatron.varlen_training.config.model import HybridConfig, ModelConfig
from megatron.varlen_training.config.moe import MoEConfig
from megatron.varlen_training.config.optimizer import OptimizerConfig
from megatron.varlen_training.config.packing import SequencePackingConfig
from megatron.varlen_training.config.parallel import ParallelConfig
from megatron.varlen_training.config.run import RunConfig
from megatron.varlen_training.config.runtime import RuntimeConfig
from megatron.varlen_training.config.training import TrainingConfig
from megatron.varlen_training.flag_errors import require
from megatron.varlen_training.hf.config import HFConfigError, config_from_model
from megatron.varlen_training.hybrid_arguments import PROG as HYBRID_PROG, parse_hybrid_args


def _values(args, cls, not_flags: tuple[str, ...] = ()) -> dict:
    """The namespace's values of the fields of the dataclass ``cls`` (named as the flags),
    but ``not_flags`` (fields no flag sets: they keep their defaults)."""
    return {name: getattr(args, name) for name in cls.__dataclass_fields__
            if name not in not_flags}


# Per-layer 0/1 patterns (or an int) of the model: a list is frozen as a tuple (so is
# --moe-layer-freq's, in moe_config).
_PER_LAYER_FIELDS = ("window_attn_skip_freq", "no_rope_freq")


def _frozen(value):
    return tuple(value) if isinstance(value, list) else value


def model_config(args, hybrid: HybridConfig | None = None) -> ModelConfig:
    spec = tuple(args.spec) if args.spec is not None else None
    frozen = {name: _frozen(getattr(args, name)) for name in _PER_LAYER_FIELDS}
    model = ModelConfig(**_values(args, ModelConfig,
                                  not_flags=("spec", "hybrid", "moe", "kernels", "mla",
                                             *frozen)),
                        spec=spec, hybrid=hybrid, moe=moe_config(args), mla=mla_config(args),
                        **frozen,
                        kernels=KernelConfig(**_values(args, KernelConfig)))
    if args.save_hf:  # fail at start-up, not after training, if the model has no HF form
        try:
            config_from_model(model)
        except HFConfigError as err:
            require(False, f"--save-hf: {err}")
    return model


def moe_config(args) -> MoEConfig | None:
    """The MoE layers (moe_arguments.py validated them), or None without --num-experts."""
    if args.num_experts is None:
        return None
    values = _values(args, MoEConfig)
    values["moe_layer_freq"] = _frozen(values["moe_layer_freq"])
    return MoEConfig(**values)


def mla_config(args) -> MLAConfig | None:
    """Multi-latent attention's shape (mla_arguments.py validated it), or None without
    --multi-latent-attention."""
    return MLAConfig(**_values(args, MLAConfig)) if args.multi_latent_attention else None


def hybrid_config(args) -> HybridConfig:
    """pretrain_mamba.py's hybrid fields (hybrid_arguments.py validated and resolved them)."""
    return HybridConfig(**_values(args, HybridConfig))


_PATH_LIST_FIELDS = ("data_path", "train_data_path", "valid_data_path", "test_data_path")
_TOKEN_LIST_FIELDS = ("tokenizer_special_tokens",)


def data_config(args) -> DataConfig:
    values = _values(args, DataConfig)
    for name in (*_PATH_LIST_FIELDS, *_TOKEN_LIST_FIELDS):  # lists, frozen as tuples
        values[name] = tuple(values[name]) if values[name] is not None else None
    return DataConfig(**values)


def runtime_config(args) -> RuntimeConfig:
    """Megatron-LM's runtime flags (runtime_arguments.py validated them)."""
    values = _values(args, RuntimeConfig, not_flags=("profile_ranks",))
    return RuntimeConfig(**values, profile_ranks=tuple(args.profile_ranks))


def run_config(args, hybrid: HybridConfig | None = None) -> RunConfig:
    """The run pretrain_gpt.py's validated flags describe (``hybrid``: pretrain_mamba.py's)."""
    return RunConfig(
        model=model_config(args, hybrid),
        parallel=ParallelConfig(**_values(args, ParallelConfig)),
        packing=SequencePackingConfig(**_values(args, SequencePackingConfig)),
        optimizer=OptimizerConfig(**_values(args, OptimizerConfig)),
        checkpoint=CheckpointConfig(**_values(args, CheckpointConfig)),
        # wandb's mode is $WANDB_MODE's (Megatron-LM has no flag for it): "auto".
        logging=LoggingConfig(**_values(args, LoggingConfig, not_flags=("wandb_mode",))),
        data=data_config(args),
        training=TrainingConfig(**_values(args, TrainingConfig, not_flags=("runtime_batches",))),
        runtime=runtime_config(args),
        flags=tuple(vars(args).items()),
    )


def hybrid_run_config(args) -> RunConfig:
    """The run pretrain_mamba.py's validated flags describe."""
    return run_config(args, hybrid_config(args))


def parse_run_config(argv: list[str] | None = None, world_size: int | None = None,
                     prog: str = "pretrain_gpt.py") -> RunConfig:
    """pretrain_gpt.py's command line -> its run; a bad flag is an ArgumentValidationError."""
    return run_config(parse_args(argv, world_size, prog))


def parse_hybrid_run_config(argv: list[str] | None = None,
                            world_size: int | None = None) -> RunConfig:
    """pretrain_mamba.py's command line -> its run (hybrid flags included)."""
    return hybrid_run_config(parse_hybrid_args(argv, world_size))


def parse_run_config_or_exit(argv: list[str] | None = None,
                             prog: str = "pretrain_gpt.py") -> RunConfig:
    """For entry points: :func:`parse_run_config`; a bad flag is one line and exit code 2."""
    with exit_on_flag_errors(prog):
        return parse_run_config(argv, prog=prog)


def parse_hybrid_run_config_or_exit(argv: list[str] | None = None) -> RunConfig:
    """For pretrain_mamba.py: :func:`parse_hybrid_run_config`, or one line and exit code 2."""
    with exit_on_flag_errors(HYBRID_PROG):
        return parse_hybrid_run_config(argv)

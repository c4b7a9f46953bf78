"""Typed, frozen run configuration: one config per component, built once (see run.py)."""

from megatron.varlen_training.config.checkpoint import CheckpointConfig
from megatron.varlen_training.config.data import DataConfig
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

__all__ = ["CheckpointConfig", "DataConfig", "HybridConfig", "LoggingConfig", "MLAConfig",
           "ModelConfig", "MoEConfig",
           "OptimizerConfig", "ParallelConfig", "RunConfig", "RuntimeConfig",
           "SequencePackingConfig",
           "TrainingConfig"]

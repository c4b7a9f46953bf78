"""Megatron-LM's optimizer-choice and weight-decay flags (its ``_add_training_args`` and
``_add_regularization_args``): honoured through megatron-core's OptimizerConfig, or refused in
one line.

- ``--optimizer adam|sgd``: megatron-core's Adam (default) or torch's SGD with
  ``--sgd-momentum`` (megatron-core builds both; training.core_optimizer_config passes the
  fields). Megatron-LM's other choices (muon, dist_muon; lion, soap, adaptive_muon on its main
  branch, newer than core_v0.16.1) are refused: megatron-core 0.16.1 builds no such optimizer
  here. SGD beside ``--use-distributed-optimizer`` is refused as megatron-core asserts (its
  distributed optimizer shards Adam only).
- ``--apply-wd-to-qk-layernorm`` (or Megatron-LM's ``--no-weight-decay-cond-type
  apply_wd_to_qk_layernorm``, which sets it): weight decay also on the q/k layernorm weights
  (megatron-core's standard param groups skip 1-D weights and biases, these included).
- The Muon / Lion tuning flags and the CPU-offload tuning flags are read by Megatron-LM only
  under ``--optimizer muon`` / ``lion`` or ``--optimizer-cpu-offload``; without those they
  change nothing there either, so they are accepted, and those switches are refused.
"""

from __future__ import annotations

import argparse

from megatron.varlen_training.refused_flags import (
    SWITCH, FlagRow, accepted_rows, add_flag_rows, read_only_with, refuse_given,
)

OPTIMIZERS = ("adam", "sgd")  # what megatron-core 0.16.1 builds here
# Megatron-LM's other --optimizer choices (core_v0.16.1: muon, dist_muon; main adds the rest).
OTHER_OPTIMIZERS = ("muon", "dist_muon", "lion", "soap", "adaptive_muon")
SGD_MOMENTUM_DEFAULT = 0.9  # Megatron-LM's (and megatron-core's SGD config's)
QK_LAYERNORM_WD_COND = "apply_wd_to_qk_layernorm"  # --no-weight-decay-cond-type's one choice
_OFFLOAD_WHY = ("megatron-core's CPU-offloading HybridDeviceOptimizer is not built here: "
                "the optimizer state stays on the training device")
REFUSED_FLAGS = (
    FlagRow(("--optimizer-cpu-offload",), SWITCH, False, _OFFLOAD_WHY),
    FlagRow(("--optimizer-cuda-graph",), SWITCH, False,
            "the optimizer step is not captured in a CUDA graph here (Megatron-LM main only)"),
    FlagRow(("--dump-param-to-param-group-map",), {}, None,
            "this fork writes no parameter-to-group map"),
    FlagRow(("--freeze-all-layers",), SWITCH, False,
            "every parameter trains here (Megatron-LM main only)"),
)
# Read by Megatron-LM only with --optimizer muon/dist_muon/lion or --optimizer-cpu-offload
# (refused here); without those Megatron-LM ignores them too.
_UNREAD = read_only_with("--optimizer muon/dist_muon/lion or --optimizer-cpu-offload")
_UNREAD_TUNING_FLAGS = accepted_rows(
    FlagRow(("--muon-momentum",), {"type": float}, 0.9, _UNREAD),
    FlagRow(("--muon-no-split-qkv",), {"action": "store_false", "dest": "muon_split_qkv"},
            True, _UNREAD),
    FlagRow(("--muon-use-nesterov",), SWITCH, False, _UNREAD),
    FlagRow(("--muon-nesterov",), SWITCH, False, _UNREAD),  # main's spelling
    FlagRow(("--muon-scale-mode",), {"choices": ("spectral", "unit_rms_norm", "shape_scaling")},
            "spectral", _UNREAD),
    FlagRow(("--muon-fp32-matmul-prec",), {"choices": ("low", "medium", "high")},
            "medium", _UNREAD),
    FlagRow(("--muon-num-ns-steps",), {"type": int}, 5, _UNREAD),
    FlagRow(("--muon-tp-mode",), {"choices": ("blockwise", "duplicated", "distributed")},
            "blockwise", _UNREAD),
    FlagRow(("--muon-extra-scale-factor",), {"type": float}, 1.0, _UNREAD),
    FlagRow(("--muon-coefficient-type",), {}, "quintic", _UNREAD),
    FlagRow(("--muon-use-syrk",), SWITCH, False, _UNREAD),
    FlagRow(("--muon-scalar-optimizer",), {"choices": ("adam", "lion")}, "adam", _UNREAD),
    FlagRow(("--lion-beta1",), {"type": float}, 0.95, _UNREAD),
    FlagRow(("--lion-beta2",), {"type": float}, 0.98, _UNREAD),
    FlagRow(("--optimizer-offload-fraction",), {"type": float}, 1.0, _UNREAD),
    FlagRow(("--use-torch-optimizer-for-cpu-offload",), SWITCH, False, _UNREAD),
    FlagRow(("--overlap-cpu-optimizer-d2h-h2d",), SWITCH, False, _UNREAD),
    FlagRow(("--no-pin-cpu-grads",), {"action": "store_false", "dest": "pin_cpu_grads"},
            True, _UNREAD),
    FlagRow(("--no-pin-cpu-params",), {"action": "store_false", "dest": "pin_cpu_params"},
            True, _UNREAD),
)


def add_optimizer_args(parser: argparse.ArgumentParser) -> None:
    """Registers the optimizer-choice and weight-decay flags, honoured and refused."""
    group = parser.add_argument_group("optimizer choice and weight decay")
    group.add_argument("--optimizer", default="adam", choices=(*OPTIMIZERS, *OTHER_OPTIMIZERS),
                       help="megatron-core's adam (AdamW-style decoupled decay, as Megatron-LM) "
                            "or sgd (torch SGD with --sgd-momentum, L2 weight decay); "
                            "Megatron-LM's other choices are refused.")
    group.add_argument("--sgd-momentum", type=float, default=SGD_MOMENTUM_DEFAULT,
                       help="SGD momentum (--optimizer sgd; Adam ignores it, as in "
                            "Megatron-LM).")
    group.add_argument("--apply-wd-to-qk-layernorm", action="store_true",
                       help="Weight decay also on the --qk-layernorm weights (the other 1-D "
                            "weights and biases still have none), as megatron-core's param "
                            "groups.")
    group.add_argument("--no-weight-decay-cond-type", default=None,
                       choices=(QK_LAYERNORM_WD_COND,),
                       help="Megatron-LM's older spelling: apply_wd_to_qk_layernorm sets "
                            "--apply-wd-to-qk-layernorm.")
    add_flag_rows(group, _UNREAD_TUNING_FLAGS)
    add_flag_rows(parser.add_argument_group("Megatron-LM optimizer flags refused here"),
                  REFUSED_FLAGS)


def validate_optimizer_args(args: argparse.Namespace, require) -> None:
    """Refuses what megatron-core cannot build here; resolves --no-weight-decay-cond-type as
    Megatron-LM does (``require(cond, message)``)."""
    refuse_given(args, REFUSED_FLAGS, require)
    require(args.optimizer in OPTIMIZERS,
            f"--optimizer {args.optimizer} is not supported: megatron-core 0.16.1 builds "
            f"{' and '.join(OPTIMIZERS)} here; use --optimizer adam or sgd")
    require(not (args.optimizer == "sgd" and args.use_distributed_optimizer),
            "--optimizer sgd with --use-distributed-optimizer is not supported: megatron-core's "
            "distributed optimizer shards Adam only (drop one of them)")
    if args.no_weight_decay_cond_type == QK_LAYERNORM_WD_COND:
        args.apply_wd_to_qk_layernorm = True
    args.no_weight_decay_cond_type = None  # consumed, as Megatron-LM's validate_args does

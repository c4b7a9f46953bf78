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
    add_refused_flags, add_unread_flags, given_refused_flags,
)

OPTIMIZERS = ("adam", "sgd")  # what megatron-core 0.16.1 builds here
# Megatron-LM's other --optimizer choices (core_v0.16.1: muon, dist_muon; main adds the rest).
OTHER_OPTIMIZERS = ("muon", "dist_muon", "lion", "soap", "adaptive_muon")
SGD_MOMENTUM_DEFAULT = 0.9  # Megatron-LM's (and megatron-core's SGD config's)
QK_LAYERNORM_WD_COND = "apply_wd_to_qk_layernorm"  # --no-weight-decay-cond-type's one choice
_OFFLOAD_WHY = ("megatron-core's CPU-offloading HybridDeviceOptimizer is not built here: "
                "the optimizer state stays on the training device")
REFUSED_FLAGS = {
    "--optimizer-cpu-offload": ({"action": "store_true"}, None, _OFFLOAD_WHY),
    "--optimizer-cuda-graph": ({"action": "store_true"}, None,
                               "the optimizer step is not captured in a CUDA graph here "
                               "(Megatron-LM main only)"),
    "--dump-param-to-param-group-map": ({}, None,
                                        "this fork writes no parameter-to-group map"),
    "--freeze-all-layers": ({"action": "store_true"}, None,
                            "every parameter trains here (Megatron-LM main only)"),
}
# Read by Megatron-LM only with --optimizer muon/dist_muon/lion or --optimizer-cpu-offload
# (refused here); without those Megatron-LM ignores them too. (flag, argparse keywords, default)
_UNREAD_TUNING_FLAGS = (
    ("--muon-momentum", {"type": float}, 0.9),
    ("--muon-no-split-qkv", {"action": "store_false", "dest": "muon_split_qkv"}, True),
    ("--muon-use-nesterov", {"action": "store_true"}, False),
    ("--muon-nesterov", {"action": "store_true"}, False),  # main's spelling
    ("--muon-scale-mode", {"choices": ("spectral", "unit_rms_norm", "shape_scaling")},
     "spectral"),
    ("--muon-fp32-matmul-prec", {"choices": ("low", "medium", "high")}, "medium"),
    ("--muon-num-ns-steps", {"type": int}, 5),
    ("--muon-tp-mode", {"choices": ("blockwise", "duplicated", "distributed")}, "blockwise"),
    ("--muon-extra-scale-factor", {"type": float}, 1.0),
    ("--muon-coefficient-type", {}, "quintic"),
    ("--muon-use-syrk", {"action": "store_true"}, False),
    ("--muon-scalar-optimizer", {"choices": ("adam", "lion")}, "adam"),
    ("--lion-beta1", {"type": float}, 0.95),
    ("--lion-beta2", {"type": float}, 0.98),
    ("--optimizer-offload-fraction", {"type": float}, 1.0),
    ("--use-torch-optimizer-for-cpu-offload", {"action": "store_true"}, False),
    ("--overlap-cpu-optimizer-d2h-h2d", {"action": "store_true"}, False),
    ("--no-pin-cpu-grads", {"action": "store_false", "dest": "pin_cpu_grads"}, True),
    ("--no-pin-cpu-params", {"action": "store_false", "dest": "pin_cpu_params"}, True),
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
    add_unread_flags(group, _UNREAD_TUNING_FLAGS,
                     "--optimizer muon/dist_muon/lion or --optimizer-cpu-offload")
    add_refused_flags(parser.add_argument_group("Megatron-LM optimizer flags refused here"),
                      REFUSED_FLAGS)


def validate_optimizer_args(args: argparse.Namespace, require) -> None:
    """Refuses what megatron-core cannot build here; resolves --no-weight-decay-cond-type as
    Megatron-LM does (``require(cond, message)``)."""
    for flag, given, why in given_refused_flags(args, REFUSED_FLAGS):
        require(False, f"{flag}{given} is not supported: {why}")
    require(args.optimizer in OPTIMIZERS,
            f"--optimizer {args.optimizer} is not supported: megatron-core 0.16.1 builds "
            f"{' and '.join(OPTIMIZERS)} here; use --optimizer adam or sgd")
    require(not (args.optimizer == "sgd" and args.use_distributed_optimizer),
            "--optimizer sgd with --use-distributed-optimizer is not supported: megatron-core's "
            "distributed optimizer shards Adam only (drop one of them)")
    if args.no_weight_decay_cond_type == QK_LAYERNORM_WD_COND:
        args.apply_wd_to_qk_layernorm = True
    args.no_weight_decay_cond_type = None  # consumed, as Megatron-LM's validate_args does

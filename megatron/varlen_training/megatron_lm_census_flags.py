"""The rest of Megatron-LM's training flags, so that no Megatron-LM command line fails on an
unknown flag: each is registered here, in a table by its answer and reason.

- ``REFUSED``: a feature this fork does not build (a GPU kernel, a communication overlap,
  FP4/FP8 extras, DeepEP/HybridEP, offloading, mHC, DSA/GDN, muP, GTP, paged stash, ...). Given,
  it stops the run in one line naming the flag and why (exit 2); Megatron-LM's default, given
  on a command line, changes nothing and is accepted.
- ``UNREAD``: tuning flags Megatron-LM reads only together with a refused feature, so without
  it they change nothing there either: accepted at any value, without effect.
- ``ACCEPTED``: flags that change nothing in a training run of Megatron-LM itself or here, each
  with the reason (a switch asking for what runs here, a flag Megatron-LM reads nowhere).
- Honoured: ``--disable-jit-fuser`` (process_settings.py runs megatron-core's jit-fused
  functions eagerly), ``--padded-vocab-size`` (the model's vocabulary rows exactly:
  run_description.py, config/run.py), ``--record-shapes`` (with the torch profiler, which
  records shapes; refused with nsys's) and ``--disable-align-grad-reduce`` (Megatron-LM main's
  second name of ``--no-align-grad-reduce``).

Numeric flags here are registered without a ``type`` (their value is compared as given with
Megatron-LM's default): refused at any other value, or read by nothing, they have no range to
check. Their default is Megatron-LM's, typed, so the megatron.wrap view lists the same value.
A flag newer than core_r0.16 (our megatron-core's release) says "Megatron-LM main" in its help.
The workloads this fork does not run (inference, RL, vision, ...) are not registered:
out_of_scope_flags.py names them in one line.
"""

from __future__ import annotations

import argparse

from megatron.varlen_training.refused_flags import dest_of

# A table row: (the flag's option strings, argparse keywords, Megatron-LM's default).
Row = tuple[tuple[str, ...], dict, object]
SWITCH = {"action": "store_true"}

_TE = "needs Transformer Engine's {what}, which this fork does not build"
_TE_KERNEL = _TE.format(what="fused kernels")
_GROUPED = ("needs Transformer Engine's grouped GEMM layers; the experts here are megatron-core's "
            "SequentialMLP (one GEMM per expert, the same math)")
_OVERLAP = ("overlaps communication with compute on CUDA streams, which this fork's schedule does "
            "not do (it overlaps only what --overlap-grad-reduce / --overlap-param-gather say)")
_OFFLOAD = "activation offloading to the host is not built here (use --recompute-activations)"
_EXPERIMENTAL_ATTENTION = ("the attention variants DSA and gated delta net are not built here: "
                           "every attention layer is softmax attention")
_MTP = ("the multi-token-prediction layers here are megatron-core 0.16.1's (one per depth, on "
        "the last pipeline stage)")
_DEBUG_DUMP = "Megatron-LM's tensor dumps for debugging are not written here"
_FLIGHT_RECORDER = ("NCCL's flight recorder is not configured by the flags here: set its "
                    "TORCH_NCCL_* / TORCH_FR_* variables in the environment")
_CHECKPOINT_TUNING = ("megatron-core 0.16.1's fully parallel checkpoint strategies run here with "
                      "their defaults: shards spread over the data-parallel group, loaded ones "
                      "exchanged by broadcast, no distribution cache, every shard's access "
                      "validated")
_VOCAB = ("without --padded-vocab-size the vocabulary is always padded here, to a multiple of "
          "--make-vocab-size-divisible-by x TP (--make-vocab-size-divisible-by 1 at TP 1 pads "
          "nothing; --padded-vocab-size N sets the size exactly)")

# why -> rows: refused unless at Megatron-LM's default.
REFUSED: dict[str, tuple[Row, ...]] = {
    _TE.format(what="FP4 layers"): (
        (("--fp4-param-gather",), SWITCH, False),),
    _TE_KERNEL: (
        (("--te-precision-config-file",), {}, None),
        (("--use-te-activation-func",), SWITCH, False),
        (("--use-transformer-engine-op-fuser",), SWITCH, False),
        (("--fused-residual-rmsnorm",), SWITCH, False),
        (("--use-fused-weighted-squared-relu",), SWITCH, False),
        (("--output-logit-dtype",), {"choices": ("bf16", "fp32"), "dest": "logit_dtype"}, None),
        (("--batch-invariant-mode",), SWITCH, False),
        (("--flash-attention-version",), {"choices": ("2", "3", "4")}, None),
        (("--symmetric-ar-type",), {"choices": ("two_shot", "one_shot", "multimem_all_reduce")},
         None),
        (("--moe-router-padding-for-quantization",), SWITCH, False),
        (("--moe-router-padding-for-fp8",), SWITCH, False),
    ),
    _GROUPED: (
        (("--use-grouped-gemm-for-dense-mlp",), SWITCH, False),
        (("--use-grouped-gemm-for-shared-expert",), SWITCH, False),
        (("--moe-use-grouped-tensor",), SWITCH, False),
        (("--moe-single-grouped-weight",), SWITCH, False),
        (("--moe-single-grouped-bias",), SWITCH, False),
        (("--moe-mlp-glu-interleave-size",), {}, None),
        (("--moe-shared-expert-glu-interleave-size",), {}, None),
    ),
    _OVERLAP: (
        (("--tp-comm-overlap-rs-dgrad",), SWITCH, False),
        (("--overlap-moe-expert-parallel-comm",), SWITCH, False),
        (("--delay-wgrad-compute",), SWITCH, False),
        (("--defer-embedding-wgrad-compute",), SWITCH, False),
        (("--overlap-p2p-communication-warmup-flush",),
         {"action": "store_true", "dest": "overlap_p2p_comm_warmup_flush"}, False),
        (("--use-ring-exchange-p2p",), SWITCH, False),
    ),
    "the pipeline sends use torch.distributed's default backend here": (
        (("--pipeline-model-parallel-comm-backend",), {"choices": ("nccl", "ucc")}, None),),
    "hierarchical context parallelism (--cp-comm-type a2a+p2p) is not built here": (
        (("--hierarchical-context-parallel-sizes",), {"nargs": "+"}, None),),
    "DeepEP's token dispatcher is not built here (--moe-token-dispatcher-type alltoall)": (
        (("--moe-enable-deepep",), SWITCH, False),),
    _OFFLOAD: (
        (("--cpu-offloading-num-layers",), {}, 0),
        (("--fine-grained-activation-offloading",), SWITCH, False),
    ),
    "manifold-constrained hyper-connections (mHC) are not built here": (
        (("--enable-mhc-connections",), SWITCH, False),),
    _EXPERIMENTAL_ATTENTION: (
        (("--experimental-attention-variant",),
         {"choices": ("gdn", "gdn2", "dsa", "gated_delta_net")}, None),),
    "the Maximal Update Parameterization (muP) is not built here": (
        (("--use-mup",), SWITCH, False),),
    "GTP weight rematerialisation is not built here (weights are split by TP / ETP only)": (
        (("--tensor-parallel-num-weight-shards",), {}, None),
        (("--expert-tensor-parallel-num-weight-shards",), {}, None),
    ),
    "the paged stash of expert activations is not built here": (
        (("--moe-paged-stash",), SWITCH, False),),
    "routing replay is not built here (the router routes every step)": (
        (("--moe-enable-routing-replay",), SWITCH, False),),
    "random router biases would differ from Megatron-LM's draws here (a benchmarking mode)": (
        (("--moe-router-force-biased",), {}, None),),
    "experts here drop no tokens per rank (--moe-expert-capacity-factor is per expert)": (
        (("--moe-expert-rank-capacity-factor",), {}, None),),
    "upcycling a dense checkpoint into MoE is not built here": (
        (("--moe-use-upcycling",), SWITCH, False),),
    _MTP: (
        (("--mtp-detach-heads",), SWITCH, False),
        (("--mtp-hsm",), SWITCH, False),
        (("--mtp-use-repeated-layer",), SWITCH, False),
        (("--mtp-standalone",), SWITCH, False),
    ),
    "multi-token prediction in hybrid models is not built here (pretrain_mamba.py refuses "
    "--mtp-num-layers)": (
        (("--mtp-hybrid-override-pattern",), {}, None),),
    "checkpoint files are not hashed here (megatron-core's dist_checkpointing checks the "
    "sharding of what it loads)": (
        (("--verify-integrity",), SWITCH, False),),
    "SIGINT / SIGTERM end the run with --exit-signal-handler here (the iteration finished, a "
    "checkpoint saved, exit 0); Megatron-LM main's shutdown without a save is not built": (
        (("--exit-signal-handler-for-training",), SWITCH, False),),
    "heterogeneous (per-layer) architectures are not built here": (
        (("--heterogeneous-layers-config-path",), {}, None),
        (("--heterogeneous-layers-config-encoded-json",), {}, None),
    ),
    "the MLP runs on the whole sequence here (no chunking)": (
        (("--mlp-chunks-for-training",), {}, 1),),
    "megatron-core 0.16.1 gathers the distributed activations on torch.cuda.current_device() "
    "(no CPU path, so this fork's CPU suite cannot prove it): each recomputed layer keeps its "
    "input whole on every tensor-parallel rank here": (
        (("--distribute-saved-activations",), SWITCH, False),),
    "the embedding keeps megatron-core's default here (its sequence-parallel output cloned)": (
        (("--no-clone-scatter-output-in-embedding", "--disable-clone-scatter-output-in-embedding"),
         {"action": "store_false", "dest": "clone_scatter_output_in_embedding"}, True),),
    "megatron-core's test mode is not used here": (
        (("--test-mode",), SWITCH, False),),
    "weights are always initialised here (layout-invariant; --load then overwrites them)": (
        (("--no-initialization",), {"action": "store_false", "dest": "perform_initialization"},
         True),),
    "weights are always built and initialised on the host here (layout-invariant init); "
    "Megatron-LM builds them on the meta device for its FSDP, and without FSDP leaves them "
    "uninitialised (to_empty) until a checkpoint loads": (
        (("--init-model-with-meta-device",), SWITCH, False),),
    _VOCAB: (
        (("--no-pad-vocab-size", "--disable-pad-vocab-size"),
         {"action": "store_false", "dest": "pad_vocab_size"}, True),
    ),
    "documents are separated by --reset-attention-mask / --reset-position-ids here (the "
    "packed THD format)": (
        (("--dataloader-inter-document-masking",), SWITCH, False),),
    _CHECKPOINT_TUNING: (
        (("--ckpt-fully-parallel-load-exchange-algo",),
         {"choices": ("broadcast", "gather_rounds", "gather_object")}, "broadcast"),
        (("--ckpt-fully-parallel-load-per-rank-objects",), SWITCH, False),
        (("--ckpt-fully-parallel-save-process-group",), {"choices": ("dp", "ep_dp")}, "dp"),
        (("--ckpt-fully-parallel-load-process-group",), {"choices": ("dp", "ep_dp")}, "dp"),
        (("--ckpt-pg-tensors-cache-path",), {}, None),
        (("--ckpt-pg-tensors-cache-create",), SWITCH, False),
        (("--no-ckpt-load-validate-sharding-integrity",
          "--disable-ckpt-load-validate-sharding-integrity"),
         {"action": "store_false", "dest": "ckpt_load_validate_sharding_integrity"}, True),
    ),
    _DEBUG_DUMP: (
        (("--save-params-interval",), {}, None),
        (("--save-activations-interval",), {}, None),
        (("--save-tokens-per-expert-interval",), {}, None),
    ),
    "the GPU sniff tests (GEMM / all-to-all throughput checks) are not run here": (
        (("--gpu-sniff-test-interval",), {}, None),),
    "megatron-core's config logger is not used here (the arguments dump prints every flag)": (
        (("--config-logger-dir",), {}, ""),),
    "Megatron-LM's YAML config is not read here: pass the flags, or use megatron.wrap's config "
    "file": (
        (("--yaml-cfg",), {}, None),),
    "megatron-core's experimental features are not used here": (
        (("--enable-experimental",), SWITCH, False),),
    "ADLR's cluster autoresume is not built here": (
        (("--adlr-autoresume",), SWITCH, False),),
    _FLIGHT_RECORDER: (
        (("--flight-recorder-dump-path",), {}, None),
        (("--flight-recorder-trace-buffer-size",), {}, 2000),
        (("--flight-recorder-include-stack-trace",), SWITCH, False),
    ),
}

# read_only_with -> rows: accepted at any value, no effect (Megatron-LM ignores them too without).
UNREAD: dict[str, tuple[Row, ...]] = {
    "--async-save": (
        (("--async-strategy",), {"choices": ("nvrx", "mcore")}, "nvrx"),
        (("--async-ckpt-cpu-priority",), {}, 10),
        (("--async-ckpt-io-priority",), {}, 3),
        (("--async-ckpt-use-cpu-shm",), SWITCH, False),
    ),
    "--fp4-format": (
        (("--fp4-recipe",), {"choices": ("nvfp4", "custom")}, "nvfp4"),
        (("--fp4-quantizer-factory",), {}, None),
    ),
    "--fp8-format": (
        (("--fp8-quantizer-factory",), {}, None),
        (("--fp8-output-proj",), SWITCH, False),
        (("--first-last-layers-bf16",), SWITCH, False),
        (("--num-layers-at-start-in-bf16",), {}, 1),
        (("--num-layers-at-end-in-bf16",), {}, 1),
        (("--reuse-grad-buf-for-mxfp8-param-ag",), SWITCH, False),
    ),
    "--batch-invariant-mode": (
        (("--batch-invariant-backend",), {"choices": ("te_native", "deepgemm", "triton")},
         "te_native"),),
    "--tp-comm-overlap": (
        (("--no-tp-comm-bulk-wgrad", "--disable-tp-comm-bulk-wgrad"),
         {"action": "store_false", "dest": "tp_comm_bulk_wgrad"}, True),
        (("--no-tp-comm-bulk-dgrad", "--disable-tp-comm-bulk-dgrad"),
         {"action": "store_false", "dest": "tp_comm_bulk_dgrad"}, True),
        (("--no-tp-comm-overlap-ag", "--disable-tp-comm-overlap-ag"),
         {"action": "store_false", "dest": "tp_comm_overlap_ag"}, True),
        (("--no-tp-comm-overlap-rs", "--disable-tp-comm-overlap-rs"),
         {"action": "store_false", "dest": "tp_comm_overlap_rs"}, True),
        (("--no-tp-comm-split-ag", "--disable-tp-comm-split-ag"),
         {"action": "store_false", "dest": "tp_comm_split_ag"}, True),
        (("--no-tp-comm-split-rs", "--disable-tp-comm-split-rs"),
         {"action": "store_false", "dest": "tp_comm_split_rs"}, True),
        (("--tp-comm-bootstrap-backend",), {"choices": ("nccl", "mpi", "gloo")}, "nccl"),
    ),
    "--overlap-moe-expert-parallel-comm": (
        (("--overlap-dispatch-backward-with-experts-wgrad",), SWITCH, False),
        (("--ep-overlap-early-attn-memory-release",), SWITCH, False),
        (("--high-priority-a2a-comm-stream",), SWITCH, False),
    ),
    "--defer-embedding-wgrad-compute": ((("--wgrad-deferral-limit",), {}, 0),),
    "--cuda-graph-impl": (
        (("--cuda-graph-modules",), {"nargs": "+"}, []),
        (("--cuda-graph-warmup-steps",), {}, 3),
    ),
    "--moe-token-dispatcher-type flex": (
        (("--moe-flex-dispatcher-backend",), {"choices": ("deepep", "hybridep", "ncclep")},
         "deepep"),
        (("--moe-flex-dispatcher-num-sms",), {}, None),
        (("--moe-deepep-num-sms",), {}, None),
        (("--moe-hybridep-num-sms",), {}, None),
        (("--moe-hybridep-num-blocks-permute",), {}, None),
        (("--moe-hybridep-num-blocks-unpermute",), {}, None),
        (("--moe-hybridep-num-sms-preprocessing",), {}, 108),
        (("--moe-hybridep-pad-uneven-dispatch-inputs",), SWITCH, False),
        (("--moe-permute-fusion-into-hybridep",), SWITCH, False),
        (("--moe-ncclep-zero-copy",), SWITCH, False),
        (("--moe-dispatch-fwd-dtype",), {"choices": ("bf16", "mxfp8")}, "bf16"),
        (("--moe-combine-bwd-dtype",), {"choices": ("bf16", "mxfp8")}, "bf16"),
    ),
    "--cpu-offloading-num-layers": (
        (("--cpu-offloading-retain-pinned-cpu-buffers",), SWITCH, False),),
    "--fine-grained-activation-offloading": (
        (("--offload-modules",), {"nargs": "+"}, []),
        (("--min-offloaded-tensor-size",), {}, 1048576),
        (("--delay-offload-until-cuda-graph",), SWITCH, False),
        (("--delta-offload-bytes-across-pp-ranks",), {}, 0),
        (("--activation-offload-fraction",), {}, 1.0),
        (("--fine-grained-offloading-max-inflight-offloads",), {}, None),
    ),
    "--enable-mhc-connections": (
        (("--mhc-num-residual-streams",), {}, 4),
        (("--mhc-sinkhorn-iterations",), {}, 20),
        (("--mhc-init-gating-factor",), {}, 0.01),
        (("--mhc-recompute-layer-num",), {}, None),
    ),
    "--experimental-attention-variant": (
        (("--dsa-indexer-n-heads",), {}, None),
        (("--dsa-indexer-head-dim",), {}, None),
        (("--dsa-indexer-topk",), {}, None),
        (("--dsa-indexer-topk-freq",), {}, 1),
        (("--dsa-indexer-skip-topk-offset",), {}, 0),
        (("--dsa-indexer-loss-coeff",), {}, None),
        (("--dsa-indexer-use-sparse-loss",), SWITCH, False),
        (("--dsa-kernel-backend",), {"choices": ("none", "tilelang", "cudnn")}, "none"),
        (("--dsa-indexer-rope-interleaved",), SWITCH, False),
        (("--no-dsa-indexer-rotate-activation", "--disable-dsa-indexer-rotate-activation"),
         {"action": "store_false", "dest": "dsa_indexer_rotate_activation"}, True),
        (("--no-dsa-indexer-scoring-relu", "--disable-dsa-indexer-scoring-relu"),
         {"action": "store_false", "dest": "dsa_indexer_scoring_relu"}, True),
        (("--dsa-indexer-k-norm-epsilon",), {}, None),
        (("--dsa-indexer-k-norm-fp32",), SWITCH, False),
        (("--linear-attention-freq",), {}, None),
        (("--linear-conv-kernel-dim",), {}, 4),
        (("--linear-key-head-dim",), {}, 128),
        (("--linear-value-head-dim",), {}, 128),
        (("--linear-num-key-heads",), {}, 16),
        (("--linear-num-value-heads",), {}, 32),
        (("--gdp-num-householder",), {}, 3),
        (("--gdp-cutedsl-kernel",), SWITCH, False),
        (("--gdp-num-chunk-states-to-recompute",), {}, 2),
    ),
    "--use-mup": (
        (("--mup-width-mult",), {}, 1.0),
        (("--mup-base-hidden-size",), {}, None),
        (("--mup-embedding-mult",), {}, 1.0),
        (("--mup-output-mult",), {}, 1.0),
        (("--mup-base-head-dim",), {}, None),
        (("--mup-attn-scale-power",), {}, 1.0),
    ),
    "--tensor-parallel-num-weight-shards": (
        (("--gtp-remat-opt-in-modules",), {"nargs": "+"}, []),
        (("--gtp-remat-nccl-ub",), SWITCH, False),
        (("--gtp-expert-remat-nccl-ub",), SWITCH, False),
        (("--gtp-remat-reduce-scatter-with-fp32-accumulation",), SWITCH, False),
    ),
    "--use-megatron-fsdp": (
        (("--megatron-fsdp-main-params-dtype",), {"choices": ("fp32", "bf16", "fp16", "auto")},
         "fp32"),
        (("--megatron-fsdp-main-grads-dtype",), {"choices": ("fp32", "bf16", "fp16", "auto")},
         "auto"),
        (("--megatron-fsdp-grad-comm-dtype",), {"choices": ("fp32", "fp16", "bf16", "auto")},
         "auto"),
        (("--megatron-fsdp-enable-fine-grained-param-gather",), SWITCH, False),
        (("--megatron-fsdp-max-pool-double-buffer",), SWITCH, False),
        (("--fsdp-db-use-persist-buf-on-alloc-fail",), SWITCH, False),
    ),
    "--moe-paged-stash": (
        (("--moe-paged-stash-page-size",), {}, 64),
        (("--moe-paged-stash-buffer-size-factor-cuda",), {}, 1.1),
        (("--moe-paged-stash-buffer-size-factor-cpu",), {}, 0.0),
    ),
    "--moe-router-load-balancing-type quantile_balancing": (
        (("--moe-router-quantile-balancing-ema",), {}, 0.0),),
    "--moe-use-upcycling": ((("--moe-upcycling-granularity",), {}, 1),),
    "--qk-clip": (
        (("--qk-clip-alpha",), {}, 0.5),
        (("--qk-clip-threshold",), {}, 100),
    ),
    "--adlr-autoresume": ((("--adlr-autoresume-interval",), {}, 1000),),
    "--optimizer muon / dist_muon (the LayerWise layout)": (
        (("--no-use-layer-wise-param-layout",),
         {"action": "store_false", "dest": "use_layer_wise_param_layout"}, True),),
    "--dataloader-type cyclic": (
        (("--no-data-sharding",), {"action": "store_false", "dest": "data_sharding"}, True),),
    "--tokenizer-type SFTTokenizer": (
        (("--sft-tokenizer-prompt-format",), {}, "nemotron-h-aligned"),),
}

# why -> rows: accepted and changing nothing, in Megatron-LM's training and here.
ACCEPTED: dict[str, tuple[Row, ...]] = {
    "Megatron-LM registers it but reads it nowhere": (
        (("--head-lr-mult",), {}, 1.0),),
    "Megatron-LM reads it only in its inference engine (the sampling seed per DP rank)": (
        (("--use-same-sampling-seed-across-dp-ranks",),
         {"action": "store_false", "dest": "offset_sampling_seed_by_dp_rank"}, True),),
    "the Multi-Storage Client is never used here, which the flag asks for (a no-op in "
    "Megatron-LM too)": (
        (("--disable-msc",), {"action": "store_true", "dest": "disable_msc_deprecated"}, False),),
    "the tokenizer's files are never copied into checkpoints here, which the flag asks for": (
        (("--no-save-tokenizer-assets", "--disable-save-tokenizer-assets"),
         {"action": "store_false", "dest": "save_tokenizer_assets"}, True),),
    "NCCL's flight recorder is not configured here, which the flag asks for": (
        (("--no-flight-recorder-dump-on-timeout", "--disable-flight-recorder-dump-on-timeout"),
         {"action": "store_false", "dest": "flight_recorder_dump_on_timeout"}, True),
        (("--no-flight-recorder-include-only-active",
          "--disable-flight-recorder-include-only-active"),
         {"action": "store_false", "dest": "flight_recorder_include_only_active"}, True),
        (("--no-flight-recorder-extra-dump-on-exec",
          "--disable-flight-recorder-extra-dump-on-exec"),
         {"action": "store_false", "dest": "flight_recorder_extra_dump_on_exec"}, True),
    ),
}
PADDED_VOCAB_SIZE = "--padded-vocab-size"
# --record-shapes: Megatron-LM main records shapes in the NVTX ranges of an nsys --profile
# window; with --use-pytorch-profiler the torch profiler here records shapes always.
RECORD_SHAPES = "--record-shapes"

# Flags of core_r0.16 (our megatron-core's release); every other flag here is Megatron-LM
# main's only (the test compares with megatron/wrap/config/megatron_lm_defaults.json).
IN_CORE_R016 = frozenset({
    "--adlr-autoresume", "--adlr-autoresume-interval", "--defer-embedding-wgrad-compute",
    "--disable-jit-fuser", "--distribute-saved-activations", "--enable-experimental",
    "--head-lr-mult", "--heterogeneous-layers-config-encoded-json",
    "--heterogeneous-layers-config-path", "--linear-attention-freq", "--moe-upcycling-granularity",
    "--moe-use-upcycling", "--padded-vocab-size", "--reuse-grad-buf-for-mxfp8-param-ag",
    "--sft-tokenizer-prompt-format", "--te-precision-config-file", "--test-mode",
    "--tp-comm-overlap-rs-dgrad", "--use-ring-exchange-p2p", "--wgrad-deferral-limit",
    "--yaml-cfg", "--no-tp-comm-bulk-wgrad", "--no-tp-comm-bulk-dgrad", "--no-tp-comm-overlap-ag",
    "--no-tp-comm-overlap-rs", "--no-tp-comm-split-ag", "--no-tp-comm-split-rs",
    "--no-data-sharding", "--no-initialization", "--disable-align-grad-reduce",
    "--no-clone-scatter-output-in-embedding",
})
MAIN_ONLY_NOTE = " Megatron-LM main's flag (newer than core_r0.16)."


def _main_note(names: tuple[str, ...]) -> str:
    return "" if names[0] in IN_CORE_R016 else MAIN_ONLY_NOTE


def _add_rows(group, rows: tuple[Row, ...], help_text: str) -> None:
    for names, kwargs, default in rows:
        group.add_argument(*names, default=default, help=help_text + _main_note(names),
                           **kwargs)


def add_census_flags(parser: argparse.ArgumentParser) -> None:
    """Registers the tables (each a group of the flag reference)."""
    refused = parser.add_argument_group("Megatron-LM feature flags refused here")
    for why, rows in REFUSED.items():
        for names, kwargs, default in rows:
            given_neutral = not kwargs.get("action") and default is not None
            shown = repr(default) if isinstance(default, str) else default  # '' stays visible
            neutral = f" (but {shown}, which changes nothing)" if given_neutral else ""
            _add_rows(refused, ((names, kwargs, default),), f"Refused{neutral}: {why}.")
    unread = parser.add_argument_group("Megatron-LM tuning flags of refused features")
    for feature, rows in UNREAD.items():
        _add_rows(unread, rows, f"Accepted, no effect: Megatron-LM reads it only with "
                                f"{feature}, refused here.")
    accepted = parser.add_argument_group("Megatron-LM flags that change nothing here")
    for why, rows in ACCEPTED.items():
        _add_rows(accepted, rows, f"Accepted, no effect: {why}.")
    _add_honoured_flags(accepted, parser.add_argument_group("Megatron-LM switches honoured here"))


def _add_honoured_flags(accepted, honoured) -> None:
    """--record-shapes (with the accepted flags: it changes nothing where it is accepted) and
    the flags this module honours."""
    accepted.add_argument(RECORD_SHAPES, action="store_true",
                          help="With --profile --use-pytorch-profiler accepted (the profiler "
                               "records shapes always); refused with nsys's --profile (its "
                               "NVTX shapes are not recorded here)." + MAIN_ONLY_NOTE)
    honoured.add_argument("--disable-jit-fuser", action="store_true",
                          help="megatron-core's jit_fuser functions (torch.compile: the MoE "
                               "router's, bias-GELU/SwiGLU's, ...) run eagerly. Megatron-LM "
                               "rebinds megatron.core.jit.jit_fuser, which misses functions "
                               "decorated at import; torch's dynamo switch is turned off too.")
    honoured.add_argument(PADDED_VOCAB_SIZE, type=int, default=None,
                          help="The model's vocabulary rows, exactly (no padding; at least the "
                               "tokenizer's vocabulary, divisible by TP), as Megatron-LM. "
                               "Default: the vocabulary padded to a multiple of "
                               "--make-vocab-size-divisible-by x TP.")
    honoured.add_argument("--disable-align-grad-reduce", action="store_false",
                          dest="align_grad_reduce",
                          help="Megatron-LM main's second name of --no-align-grad-reduce.")


def is_default(value, default) -> bool:
    """Whether ``value`` (as parsed: a string when given) is Megatron-LM's ``default``; numbers
    compare by value (``--cpu-offloading-num-layers 0`` is the default 0)."""
    if value is None or value == default:
        return True
    try:
        return float(value) == float(default)
    except (TypeError, ValueError):
        return False


def given_refusals(args: argparse.Namespace):
    """``(flag, shown value, why)`` of each refused flag given at another value than
    Megatron-LM's default."""
    for why, rows in REFUSED.items():
        for names, kwargs, default in rows:
            value = getattr(args, dest_of(names[0], kwargs))
            if not is_default(value, default):
                shown = "" if kwargs.get("action") else " " + (
                    " ".join(value) if isinstance(value, list) else str(value))
                yield names[0], shown, why


def validate_census_flags(args: argparse.Namespace, require) -> None:
    """Refuses, in one line, a refused flag given at another value than Megatron-LM's default,
    and --record-shapes in an nsys profile."""
    for flag, shown, why in given_refusals(args):
        require(False, f"{flag}{shown} is not supported: {why}")
    _validate_padded_vocab_size(args, require)
    require(not (args.record_shapes and args.profile and not args.use_pytorch_profiler),
            f"{RECORD_SHAPES} with nsys's --profile is not supported: the NVTX ranges here "
            f"carry no shapes; add --use-pytorch-profiler (its trace records shapes)")


# pretrain_mamba.py only: Megatron-LM's Mamba training flags (hybrid_arguments.py adds them).
HYBRID_REFUSED: dict[str, tuple[Row, ...]] = {
    "the Mamba training path here is megatron-core's default memory-efficient one (the fused "
    "split-conv-scan, as plain-torch twins on CPU); the unfused path is not wired": (
        (("--disable-mamba-mem-eff-path",),
         {"action": "store_false", "dest": "use_mamba_mem_eff_path"}, True),),
    "the inter-chunk SSM states keep the parameters' dtype here (megatron-core's default)": (
        (("--mamba-training-ssm-states-dtype",), {"choices": ("fp32", "bf16")}, None),),
}


def add_hybrid_census_flags(parser: argparse.ArgumentParser) -> None:
    """Registers pretrain_mamba.py's refused Mamba flags."""
    group = parser.add_argument_group("Megatron-LM Mamba flags refused here")
    for why, rows in HYBRID_REFUSED.items():
        _add_rows(group, rows, f"Refused: {why}.")


def validate_hybrid_census_flags(args: argparse.Namespace, require) -> None:
    """Refuses a refused Mamba flag given at another value than Megatron-LM's default."""
    for why, rows in HYBRID_REFUSED.items():
        for names, kwargs, default in rows:
            value = getattr(args, dest_of(names[0], kwargs))
            shown = "" if kwargs.get("action") else f" {value}"
            require(is_default(value, default), f"{names[0]}{shown} is not supported: {why}")


def _validate_padded_vocab_size(args: argparse.Namespace, require) -> None:
    """--padded-vocab-size: the vocabulary-parallel embedding splits its rows evenly over TP,
    and every token id needs a row (a vocabulary known now; config/run.py checks a tokenizer's)."""
    padded, tp = args.padded_vocab_size, args.tensor_model_parallel_size
    if padded is None:
        return
    require(padded % tp == 0, f"{PADDED_VOCAB_SIZE} {padded} is not divisible by "
                              f"--tensor-model-parallel-size {tp} (the embedding splits its rows)")
    require(args.vocab_size is None or padded >= args.vocab_size,
            f"{PADDED_VOCAB_SIZE} {padded} is smaller than --vocab-size {args.vocab_size}: every "
            f"token id needs a row")

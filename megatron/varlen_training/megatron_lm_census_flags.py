"""The rest of Megatron-LM's training flags, so that no Megatron-LM command line fails on an
unknown flag: each is registered here, a row (refused_flags.FlagRow) of a table by its answer.

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

from megatron.varlen_training.refused_flags import (
    SWITCH, FlagRow, accepted_rows, add_flag_rows, read_only_with, refuse_given, with_notes,
)

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
_GTP = "GTP weight rematerialisation is not built here (weights are split by TP / ETP only)"
_HETEROGENEOUS = "heterogeneous (per-layer) architectures are not built here"
_FLIGHT_RECORDER_OFF = "NCCL's flight recorder is not configured here, which the flag asks for"

# Refused unless at Megatron-LM's default.
REFUSED = (
    FlagRow(("--fp4-param-gather",), SWITCH, False, _TE.format(what="FP4 layers")),
    FlagRow(("--te-precision-config-file",), {}, None, _TE_KERNEL),
    FlagRow(("--use-te-activation-func",), SWITCH, False, _TE_KERNEL),
    FlagRow(("--use-transformer-engine-op-fuser",), SWITCH, False, _TE_KERNEL),
    FlagRow(("--fused-residual-rmsnorm",), SWITCH, False, _TE_KERNEL),
    FlagRow(("--use-fused-weighted-squared-relu",), SWITCH, False, _TE_KERNEL),
    FlagRow(("--output-logit-dtype",), {"choices": ("bf16", "fp32"), "dest": "logit_dtype"}, None,
            _TE_KERNEL),
    FlagRow(("--batch-invariant-mode",), SWITCH, False, _TE_KERNEL),
    FlagRow(("--flash-attention-version",), {"choices": ("2", "3", "4")}, None, _TE_KERNEL),
    FlagRow(("--symmetric-ar-type",),
            {"choices": ("two_shot", "one_shot", "multimem_all_reduce")}, None,
            _TE_KERNEL),
    FlagRow(("--moe-router-padding-for-quantization",), SWITCH, False, _TE_KERNEL),
    FlagRow(("--moe-router-padding-for-fp8",), SWITCH, False, _TE_KERNEL),
    FlagRow(("--use-grouped-gemm-for-dense-mlp",), SWITCH, False, _GROUPED),
    FlagRow(("--use-grouped-gemm-for-shared-expert",), SWITCH, False, _GROUPED),
    FlagRow(("--moe-use-grouped-tensor",), SWITCH, False, _GROUPED),
    FlagRow(("--moe-single-grouped-weight",), SWITCH, False, _GROUPED),
    FlagRow(("--moe-single-grouped-bias",), SWITCH, False, _GROUPED),
    FlagRow(("--moe-mlp-glu-interleave-size",), {}, None, _GROUPED),
    FlagRow(("--moe-shared-expert-glu-interleave-size",), {}, None, _GROUPED),
    FlagRow(("--tp-comm-overlap-rs-dgrad",), SWITCH, False, _OVERLAP),
    FlagRow(("--overlap-moe-expert-parallel-comm",), SWITCH, False, _OVERLAP),
    FlagRow(("--delay-wgrad-compute",), SWITCH, False, _OVERLAP),
    FlagRow(("--defer-embedding-wgrad-compute",), SWITCH, False, _OVERLAP),
    FlagRow(("--overlap-p2p-communication-warmup-flush",),
            {"action": "store_true", "dest": "overlap_p2p_comm_warmup_flush"}, False,
            _OVERLAP),
    FlagRow(("--use-ring-exchange-p2p",), SWITCH, False, _OVERLAP),
    FlagRow(("--pipeline-model-parallel-comm-backend",), {"choices": ("nccl", "ucc")}, None,
            "the pipeline sends use torch.distributed's default backend here"),
    FlagRow(("--hierarchical-context-parallel-sizes",), {"nargs": "+"}, None,
            "hierarchical context parallelism (--cp-comm-type a2a+p2p) is not built here"),
    FlagRow(("--moe-enable-deepep",), SWITCH, False,
            "DeepEP's token dispatcher is not built here (--moe-token-dispatcher-type alltoall)"),
    FlagRow(("--cpu-offloading-num-layers",), {}, 0, _OFFLOAD),
    FlagRow(("--fine-grained-activation-offloading",), SWITCH, False, _OFFLOAD),
    FlagRow(("--enable-mhc-connections",), SWITCH, False,
            "manifold-constrained hyper-connections (mHC) are not built here"),
    FlagRow(("--experimental-attention-variant",),
            {"choices": ("gdn", "gdn2", "dsa", "gated_delta_net")}, None,
            _EXPERIMENTAL_ATTENTION),
    FlagRow(("--use-mup",), SWITCH, False,
            "the Maximal Update Parameterization (muP) is not built here"),
    FlagRow(("--tensor-parallel-num-weight-shards",), {}, None, _GTP),
    FlagRow(("--expert-tensor-parallel-num-weight-shards",), {}, None, _GTP),
    FlagRow(("--moe-paged-stash",), SWITCH, False,
            "the paged stash of expert activations is not built here"),
    FlagRow(("--moe-enable-routing-replay",), SWITCH, False,
            "routing replay is not built here (the router routes every step)"),
    FlagRow(("--moe-router-force-biased",), {}, None,
            "random router biases would differ from Megatron-LM's draws here (a benchmarking "
            "mode)"),
    FlagRow(("--moe-expert-rank-capacity-factor",), {}, None,
            "experts here drop no tokens per rank (--moe-expert-capacity-factor is per expert)"),
    FlagRow(("--moe-use-upcycling",), SWITCH, False,
            "upcycling a dense checkpoint into MoE is not built here"),
    FlagRow(("--mtp-detach-heads",), SWITCH, False, _MTP),
    FlagRow(("--mtp-hsm",), SWITCH, False, _MTP),
    FlagRow(("--mtp-use-repeated-layer",), SWITCH, False, _MTP),
    FlagRow(("--mtp-standalone",), SWITCH, False, _MTP),
    FlagRow(("--mtp-hybrid-override-pattern",), {}, None,
            "multi-token prediction in hybrid models is not built here (pretrain_mamba.py "
            "refuses --mtp-num-layers)"),
    FlagRow(("--verify-integrity",), SWITCH, False,
            "checkpoint files are not hashed here (megatron-core's dist_checkpointing checks the "
            "sharding of what it loads)"),
    FlagRow(("--exit-signal-handler-for-training",), SWITCH, False,
            "SIGINT / SIGTERM end the run with --exit-signal-handler here (the iteration "
            "finished, a checkpoint saved, exit 0); Megatron-LM main's shutdown without a save "
            "is not built"),
    FlagRow(("--heterogeneous-layers-config-path",), {}, None, _HETEROGENEOUS),
    FlagRow(("--heterogeneous-layers-config-encoded-json",), {}, None, _HETEROGENEOUS),
    FlagRow(("--mlp-chunks-for-training",), {}, 1,
            "the MLP runs on the whole sequence here (no chunking)"),
    FlagRow(("--distribute-saved-activations",), SWITCH, False,
            "megatron-core 0.16.1 gathers the distributed activations on "
            "torch.cuda.current_device() (no CPU path, so this fork's CPU suite cannot prove "
            "it): each recomputed layer keeps its input whole on every tensor-parallel rank here"),
    FlagRow(("--no-clone-scatter-output-in-embedding",
             "--disable-clone-scatter-output-in-embedding"),
            {"action": "store_false", "dest": "clone_scatter_output_in_embedding"}, True,
            "the embedding keeps megatron-core's default here (its sequence-parallel output "
            "cloned)"),
    FlagRow(("--test-mode",), SWITCH, False, "megatron-core's test mode is not used here"),
    FlagRow(("--no-initialization",),
            {"action": "store_false", "dest": "perform_initialization"}, True,
            "weights are always initialised here (layout-invariant; --load then overwrites them)"),
    FlagRow(("--init-model-with-meta-device",), SWITCH, False,
            "weights are always built and initialised on the host here (layout-invariant init); "
            "Megatron-LM builds them on the meta device for its FSDP, and without FSDP leaves "
            "them uninitialised (to_empty) until a checkpoint loads"),
    FlagRow(("--no-pad-vocab-size", "--disable-pad-vocab-size"),
            {"action": "store_false", "dest": "pad_vocab_size"}, True,
            _VOCAB),
    FlagRow(("--dataloader-inter-document-masking",), SWITCH, False,
            "documents are separated by --reset-attention-mask / --reset-position-ids here (the "
            "packed THD format)"),
    FlagRow(("--ckpt-fully-parallel-load-exchange-algo",),
            {"choices": ("broadcast", "gather_rounds", "gather_object")}, "broadcast",
            _CHECKPOINT_TUNING),
    FlagRow(("--ckpt-fully-parallel-load-per-rank-objects",), SWITCH, False, _CHECKPOINT_TUNING),
    FlagRow(("--ckpt-fully-parallel-save-process-group",), {"choices": ("dp", "ep_dp")}, "dp",
            _CHECKPOINT_TUNING),
    FlagRow(("--ckpt-fully-parallel-load-process-group",), {"choices": ("dp", "ep_dp")}, "dp",
            _CHECKPOINT_TUNING),
    FlagRow(("--ckpt-pg-tensors-cache-path",), {}, None, _CHECKPOINT_TUNING),
    FlagRow(("--ckpt-pg-tensors-cache-create",), SWITCH, False, _CHECKPOINT_TUNING),
    FlagRow(("--no-ckpt-load-validate-sharding-integrity",
             "--disable-ckpt-load-validate-sharding-integrity"),
            {"action": "store_false", "dest": "ckpt_load_validate_sharding_integrity"}, True,
            _CHECKPOINT_TUNING),
    FlagRow(("--save-params-interval",), {}, None, _DEBUG_DUMP),
    FlagRow(("--save-activations-interval",), {}, None, _DEBUG_DUMP),
    FlagRow(("--save-tokens-per-expert-interval",), {}, None, _DEBUG_DUMP),
    FlagRow(("--gpu-sniff-test-interval",), {}, None,
            "the GPU sniff tests (GEMM / all-to-all throughput checks) are not run here"),
    FlagRow(("--config-logger-dir",), {}, "",
            "megatron-core's config logger is not used here (the arguments dump prints every "
            "flag)"),
    FlagRow(("--yaml-cfg",), {}, None,
            "Megatron-LM's YAML config is not read here: pass the flags, or use megatron.wrap's "
            "config file"),
    FlagRow(("--enable-experimental",), SWITCH, False,
            "megatron-core's experimental features are not used here"),
    FlagRow(("--adlr-autoresume",), SWITCH, False, "ADLR's cluster autoresume is not built here"),
    FlagRow(("--flight-recorder-dump-path",), {}, None, _FLIGHT_RECORDER),
    FlagRow(("--flight-recorder-trace-buffer-size",), {}, 2000, _FLIGHT_RECORDER),
    FlagRow(("--flight-recorder-include-stack-trace",), SWITCH, False, _FLIGHT_RECORDER),
)

# Accepted at any value, no effect (Megatron-LM ignores them too without the feature).
_WITH_ASYNC_SAVE = read_only_with("--async-save")
_WITH_FP4_FORMAT = read_only_with("--fp4-format")
_WITH_FP8_FORMAT = read_only_with("--fp8-format")
_WITH_BATCH_INVARIANT = read_only_with("--batch-invariant-mode")
_WITH_TP_COMM_OVERLAP = read_only_with("--tp-comm-overlap")
_WITH_EP_OVERLAP = read_only_with("--overlap-moe-expert-parallel-comm")
_WITH_WGRAD_DEFERRAL = read_only_with("--defer-embedding-wgrad-compute")
_WITH_CUDA_GRAPH_IMPL = read_only_with("--cuda-graph-impl")
_WITH_FLEX_DISPATCHER = read_only_with("--moe-token-dispatcher-type flex")
_WITH_CPU_OFFLOADING = read_only_with("--cpu-offloading-num-layers")
_WITH_FINE_GRAINED_OFFLOADING = read_only_with("--fine-grained-activation-offloading")
_WITH_MHC = read_only_with("--enable-mhc-connections")
_WITH_EXPERIMENTAL_ATTENTION = read_only_with("--experimental-attention-variant")
_WITH_USE_MUP = read_only_with("--use-mup")
_WITH_GTP = read_only_with("--tensor-parallel-num-weight-shards")
_WITH_MEGATRON_FSDP = read_only_with("--use-megatron-fsdp")
_WITH_PAGED_STASH = read_only_with("--moe-paged-stash")
_WITH_QUANTILE_BALANCING = read_only_with("--moe-router-load-balancing-type quantile_balancing")
_WITH_UPCYCLING = read_only_with("--moe-use-upcycling")
_WITH_QK_CLIP = read_only_with("--qk-clip")
_WITH_ADLR_AUTORESUME = read_only_with("--adlr-autoresume")
_WITH_MUON_LAYOUT = read_only_with("--optimizer muon / dist_muon (the LayerWise layout)")
_WITH_CYCLIC_LOADER = read_only_with("--dataloader-type cyclic")
_WITH_SFT_TOKENIZER = read_only_with("--tokenizer-type SFTTokenizer")
UNREAD = accepted_rows(
    FlagRow(("--async-strategy",), {"choices": ("nvrx", "mcore")}, "nvrx", _WITH_ASYNC_SAVE),
    FlagRow(("--async-ckpt-cpu-priority",), {}, 10, _WITH_ASYNC_SAVE),
    FlagRow(("--async-ckpt-io-priority",), {}, 3, _WITH_ASYNC_SAVE),
    FlagRow(("--async-ckpt-use-cpu-shm",), SWITCH, False, _WITH_ASYNC_SAVE),
    FlagRow(("--fp4-recipe",), {"choices": ("nvfp4", "custom")}, "nvfp4", _WITH_FP4_FORMAT),
    FlagRow(("--fp4-quantizer-factory",), {}, None, _WITH_FP4_FORMAT),
    FlagRow(("--fp8-quantizer-factory",), {}, None, _WITH_FP8_FORMAT),
    FlagRow(("--fp8-output-proj",), SWITCH, False, _WITH_FP8_FORMAT),
    FlagRow(("--first-last-layers-bf16",), SWITCH, False, _WITH_FP8_FORMAT),
    FlagRow(("--num-layers-at-start-in-bf16",), {}, 1, _WITH_FP8_FORMAT),
    FlagRow(("--num-layers-at-end-in-bf16",), {}, 1, _WITH_FP8_FORMAT),
    FlagRow(("--reuse-grad-buf-for-mxfp8-param-ag",), SWITCH, False, _WITH_FP8_FORMAT),
    FlagRow(("--batch-invariant-backend",),
            {"choices": ("te_native", "deepgemm", "triton")}, "te_native",
            _WITH_BATCH_INVARIANT),
    FlagRow(("--no-tp-comm-bulk-wgrad", "--disable-tp-comm-bulk-wgrad"),
            {"action": "store_false", "dest": "tp_comm_bulk_wgrad"}, True,
            _WITH_TP_COMM_OVERLAP),
    FlagRow(("--no-tp-comm-bulk-dgrad", "--disable-tp-comm-bulk-dgrad"),
            {"action": "store_false", "dest": "tp_comm_bulk_dgrad"}, True,
            _WITH_TP_COMM_OVERLAP),
    FlagRow(("--no-tp-comm-overlap-ag", "--disable-tp-comm-overlap-ag"),
            {"action": "store_false", "dest": "tp_comm_overlap_ag"}, True,
            _WITH_TP_COMM_OVERLAP),
    FlagRow(("--no-tp-comm-overlap-rs", "--disable-tp-comm-overlap-rs"),
            {"action": "store_false", "dest": "tp_comm_overlap_rs"}, True,
            _WITH_TP_COMM_OVERLAP),
    FlagRow(("--no-tp-comm-split-ag", "--disable-tp-comm-split-ag"),
            {"action": "store_false", "dest": "tp_comm_split_ag"}, True,
            _WITH_TP_COMM_OVERLAP),
    FlagRow(("--no-tp-comm-split-rs", "--disable-tp-comm-split-rs"),
            {"action": "store_false", "dest": "tp_comm_split_rs"}, True,
            _WITH_TP_COMM_OVERLAP),
    FlagRow(("--tp-comm-bootstrap-backend",), {"choices": ("nccl", "mpi", "gloo")}, "nccl",
            _WITH_TP_COMM_OVERLAP),
    FlagRow(("--overlap-dispatch-backward-with-experts-wgrad",), SWITCH, False, _WITH_EP_OVERLAP),
    FlagRow(("--ep-overlap-early-attn-memory-release",), SWITCH, False, _WITH_EP_OVERLAP),
    FlagRow(("--high-priority-a2a-comm-stream",), SWITCH, False, _WITH_EP_OVERLAP),
    FlagRow(("--wgrad-deferral-limit",), {}, 0, _WITH_WGRAD_DEFERRAL),
    FlagRow(("--cuda-graph-modules",), {"nargs": "+"}, [], _WITH_CUDA_GRAPH_IMPL),
    FlagRow(("--cuda-graph-warmup-steps",), {}, 3, _WITH_CUDA_GRAPH_IMPL),
    FlagRow(("--moe-flex-dispatcher-backend",),
            {"choices": ("deepep", "hybridep", "ncclep")}, "deepep",
            _WITH_FLEX_DISPATCHER),
    FlagRow(("--moe-flex-dispatcher-num-sms",), {}, None, _WITH_FLEX_DISPATCHER),
    FlagRow(("--moe-deepep-num-sms",), {}, None, _WITH_FLEX_DISPATCHER),
    FlagRow(("--moe-hybridep-num-sms",), {}, None, _WITH_FLEX_DISPATCHER),
    FlagRow(("--moe-hybridep-num-blocks-permute",), {}, None, _WITH_FLEX_DISPATCHER),
    FlagRow(("--moe-hybridep-num-blocks-unpermute",), {}, None, _WITH_FLEX_DISPATCHER),
    FlagRow(("--moe-hybridep-num-sms-preprocessing",), {}, 108, _WITH_FLEX_DISPATCHER),
    FlagRow(("--moe-hybridep-pad-uneven-dispatch-inputs",), SWITCH, False, _WITH_FLEX_DISPATCHER),
    FlagRow(("--moe-permute-fusion-into-hybridep",), SWITCH, False, _WITH_FLEX_DISPATCHER),
    FlagRow(("--moe-ncclep-zero-copy",), SWITCH, False, _WITH_FLEX_DISPATCHER),
    FlagRow(("--moe-dispatch-fwd-dtype",), {"choices": ("bf16", "mxfp8")}, "bf16",
            _WITH_FLEX_DISPATCHER),
    FlagRow(("--moe-combine-bwd-dtype",), {"choices": ("bf16", "mxfp8")}, "bf16",
            _WITH_FLEX_DISPATCHER),
    FlagRow(("--cpu-offloading-retain-pinned-cpu-buffers",), SWITCH, False, _WITH_CPU_OFFLOADING),
    FlagRow(("--offload-modules",), {"nargs": "+"}, [], _WITH_FINE_GRAINED_OFFLOADING),
    FlagRow(("--min-offloaded-tensor-size",), {}, 1048576, _WITH_FINE_GRAINED_OFFLOADING),
    FlagRow(("--delay-offload-until-cuda-graph",), SWITCH, False, _WITH_FINE_GRAINED_OFFLOADING),
    FlagRow(("--delta-offload-bytes-across-pp-ranks",), {}, 0, _WITH_FINE_GRAINED_OFFLOADING),
    FlagRow(("--activation-offload-fraction",), {}, 1.0, _WITH_FINE_GRAINED_OFFLOADING),
    FlagRow(("--fine-grained-offloading-max-inflight-offloads",), {}, None,
            _WITH_FINE_GRAINED_OFFLOADING),
    FlagRow(("--mhc-num-residual-streams",), {}, 4, _WITH_MHC),
    FlagRow(("--mhc-sinkhorn-iterations",), {}, 20, _WITH_MHC),
    FlagRow(("--mhc-init-gating-factor",), {}, 0.01, _WITH_MHC),
    FlagRow(("--mhc-recompute-layer-num",), {}, None, _WITH_MHC),
    FlagRow(("--dsa-indexer-n-heads",), {}, None, _WITH_EXPERIMENTAL_ATTENTION),
    FlagRow(("--dsa-indexer-head-dim",), {}, None, _WITH_EXPERIMENTAL_ATTENTION),
    FlagRow(("--dsa-indexer-topk",), {}, None, _WITH_EXPERIMENTAL_ATTENTION),
    FlagRow(("--dsa-indexer-topk-freq",), {}, 1, _WITH_EXPERIMENTAL_ATTENTION),
    FlagRow(("--dsa-indexer-skip-topk-offset",), {}, 0, _WITH_EXPERIMENTAL_ATTENTION),
    FlagRow(("--dsa-indexer-loss-coeff",), {}, None, _WITH_EXPERIMENTAL_ATTENTION),
    FlagRow(("--dsa-indexer-use-sparse-loss",), SWITCH, False, _WITH_EXPERIMENTAL_ATTENTION),
    FlagRow(("--dsa-kernel-backend",), {"choices": ("none", "tilelang", "cudnn")}, "none",
            _WITH_EXPERIMENTAL_ATTENTION),
    FlagRow(("--dsa-indexer-rope-interleaved",), SWITCH, False, _WITH_EXPERIMENTAL_ATTENTION),
    FlagRow(("--no-dsa-indexer-rotate-activation", "--disable-dsa-indexer-rotate-activation"),
            {"action": "store_false", "dest": "dsa_indexer_rotate_activation"}, True,
            _WITH_EXPERIMENTAL_ATTENTION),
    FlagRow(("--no-dsa-indexer-scoring-relu", "--disable-dsa-indexer-scoring-relu"),
            {"action": "store_false", "dest": "dsa_indexer_scoring_relu"}, True,
            _WITH_EXPERIMENTAL_ATTENTION),
    FlagRow(("--dsa-indexer-k-norm-epsilon",), {}, None, _WITH_EXPERIMENTAL_ATTENTION),
    FlagRow(("--dsa-indexer-k-norm-fp32",), SWITCH, False, _WITH_EXPERIMENTAL_ATTENTION),
    FlagRow(("--linear-attention-freq",), {}, None, _WITH_EXPERIMENTAL_ATTENTION),
    FlagRow(("--linear-conv-kernel-dim",), {}, 4, _WITH_EXPERIMENTAL_ATTENTION),
    FlagRow(("--linear-key-head-dim",), {}, 128, _WITH_EXPERIMENTAL_ATTENTION),
    FlagRow(("--linear-value-head-dim",), {}, 128, _WITH_EXPERIMENTAL_ATTENTION),
    FlagRow(("--linear-num-key-heads",), {}, 16, _WITH_EXPERIMENTAL_ATTENTION),
    FlagRow(("--linear-num-value-heads",), {}, 32, _WITH_EXPERIMENTAL_ATTENTION),
    FlagRow(("--gdp-num-householder",), {}, 3, _WITH_EXPERIMENTAL_ATTENTION),
    FlagRow(("--gdp-cutedsl-kernel",), SWITCH, False, _WITH_EXPERIMENTAL_ATTENTION),
    FlagRow(("--gdp-num-chunk-states-to-recompute",), {}, 2, _WITH_EXPERIMENTAL_ATTENTION),
    FlagRow(("--mup-width-mult",), {}, 1.0, _WITH_USE_MUP),
    FlagRow(("--mup-base-hidden-size",), {}, None, _WITH_USE_MUP),
    FlagRow(("--mup-embedding-mult",), {}, 1.0, _WITH_USE_MUP),
    FlagRow(("--mup-output-mult",), {}, 1.0, _WITH_USE_MUP),
    FlagRow(("--mup-base-head-dim",), {}, None, _WITH_USE_MUP),
    FlagRow(("--mup-attn-scale-power",), {}, 1.0, _WITH_USE_MUP),
    FlagRow(("--gtp-remat-opt-in-modules",), {"nargs": "+"}, [], _WITH_GTP),
    FlagRow(("--gtp-remat-nccl-ub",), SWITCH, False, _WITH_GTP),
    FlagRow(("--gtp-expert-remat-nccl-ub",), SWITCH, False, _WITH_GTP),
    FlagRow(("--gtp-remat-reduce-scatter-with-fp32-accumulation",), SWITCH, False, _WITH_GTP),
    FlagRow(("--megatron-fsdp-main-params-dtype",),
            {"choices": ("fp32", "bf16", "fp16", "auto")}, "fp32",
            _WITH_MEGATRON_FSDP),
    FlagRow(("--megatron-fsdp-main-grads-dtype",),
            {"choices": ("fp32", "bf16", "fp16", "auto")}, "auto",
            _WITH_MEGATRON_FSDP),
    FlagRow(("--megatron-fsdp-grad-comm-dtype",),
            {"choices": ("fp32", "fp16", "bf16", "auto")}, "auto",
            _WITH_MEGATRON_FSDP),
    FlagRow(("--megatron-fsdp-enable-fine-grained-param-gather",), SWITCH, False,
            _WITH_MEGATRON_FSDP),
    FlagRow(("--megatron-fsdp-max-pool-double-buffer",), SWITCH, False, _WITH_MEGATRON_FSDP),
    FlagRow(("--fsdp-db-use-persist-buf-on-alloc-fail",), SWITCH, False, _WITH_MEGATRON_FSDP),
    FlagRow(("--moe-paged-stash-page-size",), {}, 64, _WITH_PAGED_STASH),
    FlagRow(("--moe-paged-stash-buffer-size-factor-cuda",), {}, 1.1, _WITH_PAGED_STASH),
    FlagRow(("--moe-paged-stash-buffer-size-factor-cpu",), {}, 0.0, _WITH_PAGED_STASH),
    FlagRow(("--moe-router-quantile-balancing-ema",), {}, 0.0, _WITH_QUANTILE_BALANCING),
    FlagRow(("--moe-upcycling-granularity",), {}, 1, _WITH_UPCYCLING),
    FlagRow(("--qk-clip-alpha",), {}, 0.5, _WITH_QK_CLIP),
    FlagRow(("--qk-clip-threshold",), {}, 100, _WITH_QK_CLIP),
    FlagRow(("--adlr-autoresume-interval",), {}, 1000, _WITH_ADLR_AUTORESUME),
    FlagRow(("--no-use-layer-wise-param-layout",),
            {"action": "store_false", "dest": "use_layer_wise_param_layout"}, True,
            _WITH_MUON_LAYOUT),
    FlagRow(("--no-data-sharding",), {"action": "store_false", "dest": "data_sharding"}, True,
            _WITH_CYCLIC_LOADER),
    FlagRow(("--sft-tokenizer-prompt-format",), {}, "nemotron-h-aligned", _WITH_SFT_TOKENIZER),
)

# Accepted and changing nothing, in Megatron-LM's training and here.
ACCEPTED = accepted_rows(
    FlagRow(("--head-lr-mult",), {}, 1.0, "Megatron-LM registers it but reads it nowhere"),
    FlagRow(("--use-same-sampling-seed-across-dp-ranks",),
            {"action": "store_false", "dest": "offset_sampling_seed_by_dp_rank"}, True,
            "Megatron-LM reads it only in its inference engine (the sampling seed per DP rank)"),
    FlagRow(("--disable-msc",), {"action": "store_true", "dest": "disable_msc_deprecated"}, False,
            "the Multi-Storage Client is never used here, which the flag asks for (a no-op in "
            "Megatron-LM too)"),
    FlagRow(("--no-save-tokenizer-assets", "--disable-save-tokenizer-assets"),
            {"action": "store_false", "dest": "save_tokenizer_assets"}, True,
            "the tokenizer's files are never copied into checkpoints here, which the flag asks "
            "for"),
    FlagRow(("--no-flight-recorder-dump-on-timeout", "--disable-flight-recorder-dump-on-timeout"),
            {"action": "store_false", "dest": "flight_recorder_dump_on_timeout"}, True,
            _FLIGHT_RECORDER_OFF),
    FlagRow(("--no-flight-recorder-include-only-active",
             "--disable-flight-recorder-include-only-active"),
            {"action": "store_false", "dest": "flight_recorder_include_only_active"}, True,
            _FLIGHT_RECORDER_OFF),
    FlagRow(("--no-flight-recorder-extra-dump-on-exec",
             "--disable-flight-recorder-extra-dump-on-exec"),
            {"action": "store_false", "dest": "flight_recorder_extra_dump_on_exec"}, True,
            _FLIGHT_RECORDER_OFF),
)
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


def _main_note(row: FlagRow) -> str:
    return "" if row.flag in IN_CORE_R016 else MAIN_ONLY_NOTE


def add_census_flags(parser: argparse.ArgumentParser) -> None:
    """Registers the tables (each a group of the flag reference)."""
    add_flag_rows(parser.add_argument_group("Megatron-LM feature flags refused here"),
                  with_notes(REFUSED, _main_note))
    add_flag_rows(parser.add_argument_group("Megatron-LM tuning flags of refused features"),
                  with_notes(UNREAD, _main_note))
    accepted = parser.add_argument_group("Megatron-LM flags that change nothing here")
    add_flag_rows(accepted, with_notes(ACCEPTED, _main_note))
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


def validate_census_flags(args: argparse.Namespace, require) -> None:
    """Refuses, in one line, a refused flag given at another value than Megatron-LM's default,
    and --record-shapes in an nsys profile."""
    refuse_given(args, REFUSED, require)
    _validate_padded_vocab_size(args, require)
    require(not (args.record_shapes and args.profile and not args.use_pytorch_profiler),
            f"{RECORD_SHAPES} with nsys's --profile is not supported: the NVTX ranges here "
            f"carry no shapes; add --use-pytorch-profiler (its trace records shapes)")


# pretrain_mamba.py only: Megatron-LM's Mamba training flags (hybrid_arguments.py adds them).
HYBRID_REFUSED = (
    FlagRow(("--disable-mamba-mem-eff-path",),
            {"action": "store_false", "dest": "use_mamba_mem_eff_path"}, True,
            "the Mamba training path here is megatron-core's default memory-efficient one (the "
            "fused split-conv-scan, as plain-torch twins on CPU); the unfused path is not wired"),
    FlagRow(("--mamba-training-ssm-states-dtype",), {"choices": ("fp32", "bf16")}, None,
            "the inter-chunk SSM states keep the parameters' dtype here (megatron-core's default)"),
)


def add_hybrid_census_flags(parser: argparse.ArgumentParser) -> None:
    """Registers pretrain_mamba.py's refused Mamba flags."""
    add_flag_rows(parser.add_argument_group("Megatron-LM Mamba flags refused here"),
                  with_notes(HYBRID_REFUSED, _main_note))


def validate_hybrid_census_flags(args: argparse.Namespace, require) -> None:
    """Refuses a refused Mamba flag given at another value than Megatron-LM's default."""
    refuse_given(args, HYBRID_REFUSED, require)


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

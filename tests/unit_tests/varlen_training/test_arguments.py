"""The CLI contract: Megatron's flag names, derived fields, and one-line errors."""

import subprocess
import sys
from pathlib import Path

import pytest

from megatron.varlen_training.arguments import ArgumentValidationError, build_parser, parse_args
from tests.harness.training_runs import TINY_GPT_ARGS

REPO = Path(__file__).resolve().parents[3]
# Pinned flag set (torchtitan's test_no_new_cli_options): adding a flag is a reviewed diff here.
EXPECTED_FLAGS = frozenset("""
--adam-beta1 --adam-beta2 --adam-eps --attention-dropout --bf16 --calculate-per-token-loss
--clip-grad --context-parallel-size --data-path --disable-bias-linear --eval-interval
--eval-iters --ffn-hidden-size --fp16 --global-batch-size --group-query-attention --hidden-dropout
--hidden-size --init-method-std --load --log-interval --log-metrics-jsonl --log-throughput --lr
--lr-decay-iters --lr-decay-style --lr-warmup-iters --make-vocab-size-divisible-by
--max-position-embeddings --micro-batch-size --min-lr --mock-data --normalization
--num-attention-heads --num-layers --num-layers-per-virtual-pipeline-stage --num-query-groups
--pipeline-model-parallel-size --position-embedding-type --rotary-base --save --save-interval
--seed --seq-length --sequence-parallel --sft --sft-mock-dataset-config-json --swiglu
--tensor-model-parallel-size --tokenizer-model --tokenizer-type --train-iters
--untie-embeddings-and-output-weights --use-distributed-optimizer --vocab-size --weight-decay
--context-parallel-size --sequence-packing --sequence-packing-scheduler
--max-seqlen-per-dp-cp-rank --spec --dynamic-context-parallel --hybrid-context-parallel
--min-dynamic-context-parallel-size --mtp-num-layers --attention-backend --hardware-profile
--hf-checkpoint --save-hf --kv-channels --norm-epsilon --add-qkv-bias --qk-layernorm
--use-rope-scaling --rope-scaling-factor
--check-for-nan-in-loss-and-grad --no-check-for-nan-in-loss-and-grad
--override-opt_param-scheduler --use-checkpoint-opt_param-scheduler --distributed-timeout-minutes
--exit-signal-handler --exit-interval --exit-duration-in-mins
--override-data-fingerprint
--tensorboard-dir --log-validation-ppl-to-tensorboard --tensorboard-log-interval
--log-num-zeros-in-grad --log-params-norm
--loss-scale --initial-loss-scale --min-loss-scale --loss-scale-window --hysteresis
--wandb-project --wandb-exp-name --wandb-save-dir
--pad-packed-seq-alignment --thd-max-packed-sequences --thd-tail-padding-policy --cp-comm-type
--validate-packing-schedules
--train-samples --lr-warmup-samples --lr-decay-samples --lr-warmup-fraction
--lr-warmup-init --lr-wsd-decay-style --lr-wsd-decay-iters --lr-wsd-decay-samples
--start-weight-decay --end-weight-decay --weight-decay-incr-style --rampup-batch-size
--sft-messages-key --sft-prompt-key --sft-response-key
--reset-position-ids --reset-attention-mask --eod-mask-loss --packing-unit --document-piece-length
--split --train-data-path --valid-data-path --test-data-path --data-cache-path
--mmap-bin-files --no-mmap-bin-files --num-workers
--recompute-granularity --recompute-method --recompute-num-layers --recompute-modules
--recompute-activations --moe-layer-recompute
--finetune --no-load-optim --no-load-rng --pretrained-checkpoint
--overlap-grad-reduce --overlap-param-gather
--ckpt-format --auto-detect-ckpt-format --ckpt-step --exit-on-missing-checkpoint --async-save
--non-persistent-save-interval --non-persistent-ckpt-type --use-checkpoint-args
--num-experts --moe-router-topk --moe-ffn-hidden-size --moe-shared-expert-intermediate-size
--moe-layer-freq --expert-model-parallel-size --expert-tensor-parallel-size
--moe-router-load-balancing-type --moe-aux-loss-coeff --moe-z-loss-coeff
--moe-router-score-function --moe-router-pre-softmax --moe-router-topk-scaling-factor
--moe-token-dispatcher-type --moe-router-dtype --moe-expert-capacity-factor
--moe-router-enable-expert-bias --moe-router-bias-update-rate --moe-router-num-groups
--moe-router-group-topk --moe-shared-expert-overlap --moe-token-drop-policy
--moe-pad-expert-input-to-capacity
--vocab-file --merge-file --vocab-extra-ids --tokenizer-metadata --tokenizer-special-tokens
--special-tokens --tiktoken-pattern --tiktoken-num-special-tokens --tiktoken-special-tokens
--no-tokenizer-sentencepiece-ignore-extra-whitespaces
--disable-tokenizer-sentencepiece-ignore-extra-whitespaces
--tokenizer-sentencepiece-legacy --tokenizer-hf-no-use-fast --trust-remote-code
--null-tokenizer-eod-id --null-tokenizer-pad-id --chat-template --use-gigatoken
--legacy-tokenizer --tokenizer-hf-no-include-special-tokens
--decoupled-lr --decoupled-min-lr
--timing-log-level --timing-log-option --log-timers-to-tensorboard
--no-barrier-with-level-1-timing
--rotary-percent --rotary-seq-len-interpolation-factor --attention-softmax-in-fp32
--apply-query-key-layer-scaling --accumulate-allreduce-grads-in-fp32 --main-grads-dtype
--main-params-dtype --exp-avg-dtype --exp-avg-sq-dtype --use-precision-aware-optimizer
--apply-residual-connection-post-layernorm --apply-layernorm-1p
--decoder-first-pipeline-num-layers --decoder-last-pipeline-num-layers
--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split
--pipeline-model-parallel-layout --microbatch-group-size-per-virtual-pipeline-stage
--rotary-interleaved --squared-relu --quick-geglu
--init-method-xavier-uniform --fp32-residual-connection --multi-latent-attention
--mtp-loss-scaling-factor --window-size --window-attn-skip-freq --softmax-type --no-rope-freq
--attention-output-gate --qk-l2-norm --qk-clip --glu-linear-offset
--activation-func-clamp-value --embedding-init-method-std --fp8-format --fp4-format
--moe-input-jitter-eps --moe-router-force-load-balancing --moe-shared-expert-gate
--moe-apply-probs-on-input --moe-latent-size --fp16-lm-cross-entropy
--no-masked-softmax-fusion --no-bias-gelu-fusion --no-bias-swiglu-fusion
--no-bias-dropout-fusion --no-rope-fusion --no-gradient-accumulation-fusion
--no-persist-layer-norm --cross-entropy-loss-fusion --cross-entropy-fusion-impl
--disable-bf16-reduced-precision-matmul --transformer-impl --moe-grouped-gemm
--moe-permute-fusion --moe-router-fusion --rope-type --use-flash-attn --openai-gelu --onnx-safe
--use-mcore-models --use-rotary-position-embeddings --no-position-embedding --enable-cuda-graph
--external-cuda-graph --use-legacy-models --fp8-recipe --fp8-margin --fp8-interval
--fp8-amax-history-len --fp8-amax-compute-algo --fp8-param-gather --tp-comm-overlap
--tp-comm-overlap-cfg --cuda-graph-impl --cuda-graph-scope --te-rng-tracker --batch-size --warmup
--model-parallel-size --checkpoint-activations --no-fp8-wgrad --disable-fp8-wgrad
--tensorboard-queue-size --no-log-loss-scale-to-tensorboard
--disable-log-loss-scale-to-tensorboard --log-world-size-to-tensorboard --wandb-entity
--moe-per-layer-logging --log-memory-to-tensorboard --log-memory-interval
--log-device-memory-used --log-progress --log-energy --log-max-attention-logit
--moe-routing-trace-path --moe-routing-trace-max-training-iters
--moe-routing-trace-capture-logits --moe-routing-trace-capture-hidden-states
--moe-routing-trace-dump-weights --otel-enabled --otel-service-name --otel-span-groups
--num-virtual-stages-per-pipeline-rank --step-batch-size-schedule
--manual-gc --manual-gc-interval --no-manual-gc-eval --disable-manual-gc-eval
--empty-unused-memory-level --profile --use-pytorch-profiler --profile-step-start
--profile-step-end --profile-ranks --record-memory-history --memory-snapshot-path
--logging-level --distributed-backend --deterministic-mode --use-cpu-initialization
--no-one-logger --log-straggler --disable-straggler-on-startup --straggler-ctrlr-port
--straggler-minmax-count --check-for-large-grads --enable-ft-package --calc-ft-timeouts
--ft-num-warmup-iters --one-logger-project --one-logger-run-name --one-logger-async
--app-tag-run-name --app-tag-run-version --inprocess-restart --inprocess-max-iterations
--inprocess-monitor-thread-interval --inprocess-monitor-process-interval
--inprocess-progress-watchdog-interval --inprocess-heartbeat-interval --inprocess-soft-timeout
--inprocess-hard-timeout --inprocess-heartbeat-timeout --inprocess-barrier-timeout
--inprocess-completion-timeout --inprocess-last-call-wait --inprocess-termination-grace-time
--inprocess-granularity --inprocess-active-world-size --inprocess-empty-cuda-cache
--pytorch-profiler-collect-shapes --pytorch-profiler-collect-callstack
--pytorch-profiler-collect-chakra --nvtx-ranges
--rerun-mode --error-injection-rate --error-injection-type --check-for-spiky-loss
--result-rejected-tracker-filename --check-weight-hash-across-dp-replicas-interval
--optimizer --sgd-momentum --apply-wd-to-qk-layernorm --no-weight-decay-cond-type
--q-lora-rank --kv-lora-rank --qk-head-dim --qk-pos-emb-head-dim --v-head-dim
--rotary-scaling-factor --mscale --mscale-all-dim --cache-mla-latents --mla-down-proj-fusion
--yarn-original-max-position-embeddings --yarn-beta-fast --yarn-beta-slow
--yarn-correction-range-round-to-int --no-yarn-correction-range-round-to-int
--optimizer-cpu-offload --optimizer-cuda-graph --dump-param-to-param-group-map
--freeze-all-layers --muon-momentum --muon-no-split-qkv --muon-use-nesterov --muon-nesterov
--muon-scale-mode --muon-fp32-matmul-prec --muon-num-ns-steps --muon-tp-mode
--muon-extra-scale-factor --muon-coefficient-type --muon-use-syrk --muon-scalar-optimizer
--lion-beta1 --lion-beta2 --optimizer-offload-fraction --use-torch-optimizer-for-cpu-offload
--overlap-cpu-optimizer-d2h-h2d --no-pin-cpu-grads --no-pin-cpu-params
--ddp-bucket-size --ddp-num-buckets --ddp-average-in-collective
--ddp-pad-buckets-for-high-nccl-busbw --grad-reduce-in-bf16 --no-align-param-gather
--no-align-grad-reduce --no-overlap-p2p-communication --overlap-p2p-communication
--data-parallel-sharding-strategy --outer-dp-sharding-strategy
--torch-fsdp2-no-reshard-after-forward --no-gradient-reduce-div-fusion --fsdp-double-buffer
--suggested-communication-unit-size --keep-fp8-transpose-cache --enable-full-sharding-in-hsdp
--disable-symmetric-registration --fsdp-manual-registration --megatron-fsdp-version
--use-torch-fsdp2 --use-megatron-fsdp --num-distributed-optimizer-instances
--overlap-param-gather-with-optimizer-step --ddp-reduce-scatter-with-fp32-accumulation
--ddp-param-name-patterns-for-fp32-local-accumulation --create-all-gather-group --use-sharp
--sharp-enabled-group --nccl-communicator-config-path --use-tp-pp-dp-mapping
--fake-process-group --use-nccl-ub --lazy-mpu-init --num-virtual-stages-per-pipeline-rank
--local-rank --no-scatter-gather-tensors-in-pipeline --distributed-timeout-seconds-after-init
--override-opt-param-scheduler --use-checkpoint-opt-param-scheduler
--iterations-to-skip --train-sync-interval --decrease-batch-size-if-needed
--check-weight-hash-across-dp-replicas-interval --result-rejected-tracker-filename
--high-priority-stream-groups --disable-gloo-process-groups
--no-save-optim --no-save-rng --no-ckpt-fully-parallel-save --disable-ckpt-fully-parallel-save
--ckpt-fully-parallel-save --ckpt-fully-parallel-load --dist-ckpt-strictness
--persistent-save-interval --use-dist-ckpt --dist-ckpt-format --ckpt-assume-constant-structure
--no-strict-fsdp-dtensor-load --disable-strict-fsdp-dtensor-load
--dist-ckpt-optim-fully-reshardable --distrib-optim-fully-reshardable-mem-efficient
--ckpt-convert-format --ckpt-convert-save --ckpt-convert-update-legacy-dist-opt-format
--non-persistent-global-ckpt-dir --non-persistent-local-ckpt-dir
--non-persistent-local-ckpt-algo --replication --replication-jump --replication-factor
--use-persistent-ckpt-worker --save-retain-interval --save-wgrads-interval
--save-dgrads-interval --load-main-params-from-ckpt --dist-ckpt-save-pre-mcore-014
--use-mp-args-from-checkpoint-args --no-use-tokenizer-model-from-checkpoint-args
--disable-use-tokenizer-model-from-checkpoint-args --dist-ckpt-workers
--ckpt-drop-redundant-extra-state --override-ckpt-iteration
--dataloader-type --num-dataset-builder-threads --mid-level-dataset-surplus
--allow-ambiguous-pad-tokens --no-create-attention-mask-in-dataloader --fim-rate
--fim-spm-rate --fim-split-sample --fim-fragment-rate --fim-no-prefix --fim-prefix-token
--fim-middle-token --fim-suffix-token --fim-pad-token --fim-eod-token --data-args-path
--per-split-data-args-path --per-dataset-sequences-path --object-storage-cache-path
--phase-transition-iterations --dataloader-fast-cache-load --dataloader-defer-npy-index-mmap
--fim-data --symmetric-ar-type
--activation-offload-fraction --adlr-autoresume --adlr-autoresume-interval
--batch-invariant-backend --batch-invariant-mode --config-logger-dir --cpu-offloading-num-layers
--cpu-offloading-retain-pinned-cpu-buffers --cuda-graph-modules --cuda-graph-warmup-steps
--dataloader-inter-document-masking --defer-embedding-wgrad-compute
--delay-offload-until-cuda-graph --delay-wgrad-compute --delta-offload-bytes-across-pp-ranks
--disable-align-grad-reduce --disable-clone-scatter-output-in-embedding
--disable-dsa-indexer-rotate-activation --disable-dsa-indexer-scoring-relu
--disable-flight-recorder-dump-on-timeout --disable-flight-recorder-extra-dump-on-exec
--disable-flight-recorder-include-only-active --disable-jit-fuser --disable-msc
--disable-pad-vocab-size --disable-tp-comm-bulk-dgrad --disable-tp-comm-bulk-wgrad
--disable-tp-comm-overlap-ag --disable-tp-comm-overlap-rs --disable-tp-comm-split-ag
--disable-tp-comm-split-rs --distribute-saved-activations --dsa-indexer-head-dim
--dsa-indexer-k-norm-epsilon --dsa-indexer-k-norm-fp32 --dsa-indexer-loss-coeff
--dsa-indexer-n-heads --dsa-indexer-rope-interleaved --dsa-indexer-skip-topk-offset
--dsa-indexer-topk --dsa-indexer-topk-freq --dsa-indexer-use-sparse-loss --dsa-kernel-backend
--enable-experimental --enable-mhc-connections --ep-overlap-early-attn-memory-release
--experimental-attention-variant --expert-tensor-parallel-num-weight-shards
--fine-grained-activation-offloading --fine-grained-offloading-max-inflight-offloads
--first-last-layers-bf16 --flash-attention-version --flight-recorder-dump-path
--flight-recorder-include-stack-trace --flight-recorder-trace-buffer-size --fp4-param-gather
--fp4-quantizer-factory --fp4-recipe --fp8-output-proj --fp8-quantizer-factory
--fsdp-db-use-persist-buf-on-alloc-fail --fused-residual-rmsnorm --gdp-cutedsl-kernel
--gdp-num-chunk-states-to-recompute --gdp-num-householder --gpu-sniff-test-interval
--gtp-expert-remat-nccl-ub --gtp-remat-nccl-ub --gtp-remat-opt-in-modules
--gtp-remat-reduce-scatter-with-fp32-accumulation --head-lr-mult
--heterogeneous-layers-config-encoded-json --heterogeneous-layers-config-path
--hierarchical-context-parallel-sizes --high-priority-a2a-comm-stream --init-model-with-meta-device
--linear-attention-freq --linear-conv-kernel-dim --linear-key-head-dim --linear-num-key-heads
--linear-num-value-heads --linear-value-head-dim --megatron-fsdp-enable-fine-grained-param-gather
--megatron-fsdp-grad-comm-dtype --megatron-fsdp-main-grads-dtype --megatron-fsdp-main-params-dtype
--megatron-fsdp-max-pool-double-buffer --mhc-init-gating-factor --mhc-num-residual-streams
--mhc-recompute-layer-num --mhc-sinkhorn-iterations --min-offloaded-tensor-size
--mlp-chunks-for-training --moe-combine-bwd-dtype --moe-deepep-num-sms --moe-dispatch-fwd-dtype
--moe-enable-deepep --moe-enable-routing-replay --moe-expert-rank-capacity-factor
--moe-flex-dispatcher-backend --moe-flex-dispatcher-num-sms --moe-hybridep-num-blocks-permute
--moe-hybridep-num-blocks-unpermute --moe-hybridep-num-sms --moe-hybridep-num-sms-preprocessing
--moe-hybridep-pad-uneven-dispatch-inputs --moe-mlp-glu-interleave-size --moe-ncclep-zero-copy
--moe-paged-stash --moe-paged-stash-buffer-size-factor-cpu
--moe-paged-stash-buffer-size-factor-cuda --moe-paged-stash-page-size
--moe-permute-fusion-into-hybridep --moe-router-force-biased --moe-router-padding-for-fp8
--moe-router-padding-for-quantization --moe-router-quantile-balancing-ema
--moe-shared-expert-glu-interleave-size --moe-single-grouped-bias --moe-single-grouped-weight
--moe-upcycling-granularity --moe-use-grouped-tensor --moe-use-upcycling --mtp-detach-heads
--mtp-hsm --mtp-use-repeated-layer --mup-attn-scale-power --mup-base-head-dim
--mup-base-hidden-size --mup-embedding-mult --mup-output-mult --mup-width-mult
--no-clone-scatter-output-in-embedding --no-data-sharding --no-dsa-indexer-rotate-activation
--no-dsa-indexer-scoring-relu --no-flight-recorder-dump-on-timeout
--no-flight-recorder-extra-dump-on-exec --no-flight-recorder-include-only-active
--no-initialization --no-pad-vocab-size --no-tp-comm-bulk-dgrad --no-tp-comm-bulk-wgrad
--no-tp-comm-overlap-ag --no-tp-comm-overlap-rs --no-tp-comm-split-ag --no-tp-comm-split-rs
--no-use-layer-wise-param-layout --num-layers-at-end-in-bf16 --num-layers-at-start-in-bf16
--offload-modules --output-logit-dtype --overlap-dispatch-backward-with-experts-wgrad
--overlap-moe-expert-parallel-comm --overlap-p2p-communication-warmup-flush --padded-vocab-size
--pipeline-model-parallel-comm-backend --qk-clip-alpha --qk-clip-threshold --record-shapes
--reuse-grad-buf-for-mxfp8-param-ag --save-activations-interval --save-params-interval
--save-tokens-per-expert-interval --sft-tokenizer-prompt-format --te-precision-config-file
--tensor-parallel-num-weight-shards --test-mode --tp-comm-bootstrap-backend
--tp-comm-overlap-rs-dgrad --use-fused-weighted-squared-relu --use-grouped-gemm-for-dense-mlp
--use-grouped-gemm-for-shared-expert --use-mup --use-ring-exchange-p2p
--use-same-sampling-seed-across-dp-ranks --use-te-activation-func --use-transformer-engine-op-fuser
--wgrad-deferral-limit --yaml-cfg --mtp-standalone --mtp-hybrid-override-pattern
--verify-integrity --exit-signal-handler-for-training --no-save-tokenizer-assets
--disable-save-tokenizer-assets
--async-strategy --async-ckpt-cpu-priority --async-ckpt-io-priority --async-ckpt-use-cpu-shm
--ckpt-fully-parallel-load-exchange-algo --ckpt-fully-parallel-load-per-rank-objects
--ckpt-fully-parallel-save-process-group --ckpt-fully-parallel-load-process-group
--ckpt-pg-tensors-cache-path --ckpt-pg-tensors-cache-create
--no-ckpt-load-validate-sharding-integrity --disable-ckpt-load-validate-sharding-integrity
--skip-train --exit-signal --exit-signal-handler-for-dataloader --eval-micro-batch-size
--eval-global-batch-size --encoder-seq-length --full-validation --multiple-validation-sets
--validation-set-names --start-eval-at-iter --decoder-seq-length --data-parallel-random-init
""".split())


def _flags():
    return {opt for action in build_parser().flag_actions for opt in action.option_strings
            if opt.startswith("--") and opt != "--help"}


def test_flag_set_is_pinned():
    assert _flags() == EXPECTED_FLAGS, (
        f"new: {sorted(_flags() - EXPECTED_FLAGS)}, missing: {sorted(EXPECTED_FLAGS - _flags())}")


def test_derived_fields():
    args = parse_args(TINY_GPT_ARGS + ["--train-iters", "3", "--tensor-model-parallel-size", "2",
                                       "--global-batch-size", "16"], world_size=8)
    assert args.data_parallel_size == 4
    assert args.num_microbatches == 2  # 16 samples / (micro batch 2 x 4 DP ranks)
    assert args.max_position_embeddings == args.seq_length
    assert args.lr_decay_iters == 3


def test_sequence_parallel_without_tensor_parallelism_is_turned_off(capsys):
    """Megatron-LM's validate_args: with one TP rank --sequence-parallel is dropped with its
    warning (its Mixtral recipe passes it at TP 1), not refused; with TP 2 it stays."""
    args = parse_args(TINY_GPT_ARGS + ["--train-iters", "3", "--sequence-parallel"], world_size=1)
    assert args.sequence_parallel is False
    assert "Disabling sequence parallelism because tensor model parallelism is disabled" in \
        capsys.readouterr().out
    args = parse_args(TINY_GPT_ARGS + ["--train-iters", "3", "--sequence-parallel",
                                       "--tensor-model-parallel-size", "2"], world_size=2)
    assert args.sequence_parallel is True


@pytest.mark.parametrize("extra, groups", [
    ([], 4),  # no grouped-query attention: one group per head
    (["--group-query-attention"], 1),  # Megatron-LM's --num-query-groups default: 1 (MQA)
    (["--group-query-attention", "--num-query-groups", "2"], 2),
])
def test_query_groups_follow_megatron_lm(extra, groups):
    args = parse_args(TINY_GPT_ARGS + ["--train-iters", "3"] + extra, world_size=1)
    assert (args.num_attention_heads, args.num_query_groups) == (4, groups)


@pytest.mark.parametrize("extra, world, needle", [
    (["--tensor-model-parallel-size", "3"], 4, "world size 4 is not divisible"),
    (["--context-parallel-size", "2", "--seq-length", "30"], 2, "--seq-length 30"),
    (["--global-batch-size", "3"], 2, "--global-batch-size 3"),
    (["--load", "/nonexistent/ckpt"], 1, "--load directory '/nonexistent/ckpt'"),
    (["--num-layers-per-virtual-pipeline-stage", "1"], 1, "--pipeline-model-parallel-size > 1"),
    (["--no-such-flag"], 1, "unrecognized arguments: --no-such-flag"),
    (["--attention-backend", "flash", "--attention-dropout", "0.1"], 1,
     "--attention-backend flash has no attention dropout (got --attention-dropout 0.1)"),
    (["--attention-backend", "te"], 1, "--attention-backend te needs Transformer Engine"),
    (["--lr-warmup-iters", "3"], 1, "--lr-warmup-iters 3 must be smaller than the decay length 3"),
    (["--ffn-hidden-size", "85", "--tensor-model-parallel-size", "2"], 2,
     "--ffn-hidden-size 85 is not divisible by --tensor-model-parallel-size 2"),
    (["--swiglu", "--hidden-size", "16", "--num-attention-heads", "2"], 1,
     "--swiglu with --hidden-size 16: Megatron-LM's default --ffn-hidden-size"),
    (["--group-query-attention", "--num-query-groups", "1", "--tensor-model-parallel-size", "2"],
     2, "--num-query-groups 1 is not divisible by --tensor-model-parallel-size 2"),
])
def test_bad_combinations_raise_one_line(extra, world, needle):
    with pytest.raises(ArgumentValidationError) as err:
        parse_args(TINY_GPT_ARGS + ["--train-iters", "3"] + extra, world_size=world)
    message = str(err.value)
    assert needle in message and "\n" not in message, message


@pytest.mark.parametrize("extra, env_world, needle", [
    (["--tensor-model-parallel-size", "2"], "3", "world size 3 is not divisible"),
    (["--load", "/nonexistent/ckpt"], "1", "/nonexistent/ckpt"),
    (["--bogus"], "1", "unrecognized arguments: --bogus"),
    # a hybrid flag: one line pointing at the hybrid entry point (megatron_lm_census_flags.py)
    (["--mamba-state-dim", "64"], "1", "--mamba-state-dim is a Megatron-LM hybrid-model flag: "
                                       "run pretrain_mamba.py"),
    (["--context-parallel-size", "2", "--seq-length", "30"], "2", "--seq-length 30"),
])
def test_entry_point_exits_with_one_line(extra, env_world, needle):
    env = {"WORLD_SIZE": env_world, "PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "pretrain_gpt.py"), *TINY_GPT_ARGS, "--train-iters", "1",
         *extra], capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], proc.stderr


def test_flag_reference_doc_is_current():
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "flag_reference.py"), "--check"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr


# Megatron-LM's defaults (arguments.py): 4h; with --swiglu int(4h * 2/3 / 64) * 64.
@pytest.mark.parametrize("hidden,swiglu,ffn", [
    (32, False, 128), (32, True, 64), (1024, True, 2688), (2048, True, 5440),
    (4096, True, 10880), (96, True, 256),
])
def test_default_ffn_hidden_size_is_megatron_lms(hidden, swiglu, ffn):
    argv = TINY_GPT_ARGS + ["--train-iters", "3", "--hidden-size", str(hidden)]
    args = parse_args(argv + (["--swiglu"] if swiglu else []), world_size=1)
    assert args.ffn_hidden_size == ffn


@pytest.mark.parametrize("which", ["pretrain_gpt", "pretrain_mamba", "set_defaults"])
def test_parser_defaults_are_argparses_get_default(which):
    """``defaults()`` (one pass, what the facade's namespace reads) against argparse's own
    ``get_default`` for every dest, also after ``set_defaults`` (--hf-checkpoint's path) of a
    flag with a default, a flag defaulting to None and a dest no flag has, and for two flags
    of one dest with different defaults."""
    from megatron.varlen_training.hybrid_arguments import build_hybrid_parser

    parser = build_hybrid_parser() if which == "pretrain_mamba" else build_parser()
    if which == "set_defaults":
        parser.set_defaults(num_layers=7, load="/ckpt", not_a_flag="x")
        parser.add_argument("--pair-on", dest="pair", action="store_true")  # first: False
        parser.add_argument("--pair-off", dest="pair", action="store_false")
    dests = {action.dest for action in parser.flag_actions} | {"not_a_flag"}
    defaults = parser.defaults()
    assert any(parser.get_default(dest) is None for dest in dests)
    for dest in dests:
        assert defaults.get(dest) is parser.get_default(dest), dest

#!/usr/bin/env bash
# The main job: a tiny GPT trained on 4 CPU ranks with TP=2 x PP=2 (gloo), then the same data
# packed (THD) -- see README.md. Loss must fall; each run prints Megatron's log lines.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCHRUN=.venv/bin/torchrun
COMMON=(--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 128
        --micro-batch-size 2 --global-batch-size 8 --train-iters 20 --lr 3e-3
        --lr-warmup-iters 2 --lr-decay-style cosine --mock-data
        --tokenizer-type NullTokenizer --vocab-size 128 --log-interval 5 --eval-iters 0
        --position-embedding-type rope)
echo "== TP=2 x PP=2, fixed-length mock data =="
$TORCHRUN --nproc-per-node 4 --master-port "${DEMO_PORT:-29517}" pretrain_gpt.py "${COMMON[@]}" \
  --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2

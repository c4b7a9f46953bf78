#!/usr/bin/env bash
# The main job (README): tiny GPTs trained on 4 CPU ranks (gloo), each printing Megatron's log
# lines; the loss falls in both.
#   1. TP=2 x PP=2 on fixed-length mock data (the foundation).
#   2. Sequence packing + dynamic context parallelism on real SFT text (examples/data), with
#      the byte-level tokenizer: DP=2 x CP=2, every sequence on a CP group sized for it.
#   3./4. The megatron.wrap facade fed batches at run time (examples/wrap).
#   5. A Hugging Face checkpoint fine-tuned through the facade and saved back (no download).
#   6. A hybrid Mamba-Transformer (pretrain_mamba.py, pattern M*M-) on the same packed SFT data
#      with dynamic CP: the Mamba mixer switches CP group per micro-batch like attention.
#   7. Pretraining on real text (the Python standard library's functions and classes, offline):
#      preprocessed to .bin/.idx, every document of every sample packed as its own sequence
#      with dynamic CP (DP=2 x CP=2).
#   8. A Mixture-of-Experts GPT (expert parallelism 2) on the same packed SFT data with dynamic
#      CP, printing its balancing losses beside lm loss (docs/MOE.md).
set -euo pipefail
cd "$(dirname "$0")/.."
# --standalone: torchrun binds its rendezvous on a port the OS picks and holds (a fixed port may
# be taken by another job); DEMO_PORT=N pins one instead.
if [[ -n "${DEMO_PORT:-}" ]]; then MEET=(--master-port "$DEMO_PORT"); else MEET=(--standalone); fi
TORCHRUN=(.venv/bin/torchrun --nproc-per-node 4 "${MEET[@]}")
TINY=(--hidden-size 64 --num-attention-heads 4 --lr 3e-3 --lr-warmup-iters 3
      --lr-decay-style cosine --log-interval 5 --eval-iters 0 --position-embedding-type rope)

echo "== 1. TP=2 x PP=2, fixed-length mock data =="
"${TORCHRUN[@]}" pretrain_gpt.py "${TINY[@]}" --num-layers 4 --seq-length 128 \
  --micro-batch-size 2 --global-batch-size 8 --train-iters 20 \
  --mock-data --tokenizer-type NullTokenizer --vocab-size 128 \
  --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2

echo "== 2. Packed SFT with dynamic CP (DP=2 x CP=2), examples/data/sft_tiny.jsonl =="
"${TORCHRUN[@]}" pretrain_gpt.py "${TINY[@]}" --num-layers 2 --seq-length 512 \
  --micro-batch-size 1 --global-batch-size 16 --train-iters 30 \
  --sft --data-path examples/data/sft_tiny.jsonl --tokenizer-type ByteLevelTokenizer \
  --hidden-dropout 0 --attention-dropout 0 \
  --sequence-packing --dynamic-context-parallel --context-parallel-size 2 \
  --max-seqlen-per-dp-cp-rank 128

echo "== 3. megatron.wrap: SFT on runtime batches from the JSONL (2 ranks) =="
.venv/bin/torchrun --nproc-per-node 2 "${MEET[@]}" \
  examples/wrap/sft_jsonl.py

echo "== 4. megatron.wrap: RL-style runtime batches of varying size and length (2 ranks) =="
.venv/bin/torchrun --nproc-per-node 2 "${MEET[@]}" \
  examples/wrap/rl_runtime_loop.py --steps 20

echo "== 5. Hugging Face in and out: a tiny local Qwen2-style model fine-tuned with its chat template (2 ranks) =="
HF_OUT=$(mktemp -d)
HF_HUB_OFFLINE=1 .venv/bin/torchrun --nproc-per-node 2 "${MEET[@]}" \
  examples/wrap/hf_finetune.py --steps 10 --out "$HF_OUT/finetuned" --tiny-dir "$HF_OUT/tiny"
rm -rf "$HF_OUT"

echo "== 6. Hybrid Mamba-Transformer (M*M-), packed SFT with dynamic CP (DP=2 x CP=2) =="
"${TORCHRUN[@]}" pretrain_mamba.py "${TINY[@]}" --num-layers 4 --hybrid-layer-pattern 'M*M-' \
  --mamba-head-dim 16 --mamba-num-groups 2 --mamba-state-dim 16 --seq-length 512 \
  --micro-batch-size 1 --global-batch-size 16 --train-iters 20 \
  --sft --data-path examples/data/sft_tiny.jsonl --tokenizer-type ByteLevelTokenizer \
  --hidden-dropout 0 --attention-dropout 0 \
  --sequence-packing --dynamic-context-parallel --context-parallel-size 2 \
  --max-seqlen-per-dp-cp-rank 128

echo "== 7. Pretraining on real text: packed documents with dynamic CP (DP=2 x CP=2) =="
CORPUS=$(mktemp -d)
.venv/bin/python tools/stdlib_corpus.py --output "$CORPUS/stdlib.jsonl"
.venv/bin/python tools/preprocess_data.py --input "$CORPUS/stdlib.jsonl" --json-keys text \
  --tokenizer-type ByteLevelTokenizer --append-eod --output-prefix "$CORPUS/stdlib" --workers 2
"${TORCHRUN[@]}" pretrain_gpt.py "${TINY[@]}" --num-layers 2 --seq-length 512 \
  --micro-batch-size 1 --global-batch-size 16 --train-iters 20 \
  --data-path "$CORPUS/stdlib_text_document" --split 98,2,0 --tokenizer-type ByteLevelTokenizer \
  --hidden-dropout 0 --attention-dropout 0 \
  --reset-position-ids --reset-attention-mask --eod-mask-loss \
  --sequence-packing --dynamic-context-parallel --context-parallel-size 2 \
  --max-seqlen-per-dp-cp-rank 128
rm -rf "$CORPUS"
echo "== 8. Mixture of Experts (8 experts, top-2, EP=2), packed SFT with dynamic CP (DP=2 x CP=2) =="
"${TORCHRUN[@]}" pretrain_gpt.py "${TINY[@]}" --num-layers 2 --seq-length 512 \
  --micro-batch-size 1 --global-batch-size 16 --train-iters 20 \
  --sft --data-path examples/data/sft_tiny.jsonl --tokenizer-type ByteLevelTokenizer \
  --hidden-dropout 0 --attention-dropout 0 --disable-bias-linear \
  --num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 64 \
  --moe-shared-expert-intermediate-size 64 --expert-model-parallel-size 2 \
  --moe-router-load-balancing-type seq_aux_loss --moe-aux-loss-coeff 1e-2 \
  --moe-z-loss-coeff 1e-3 \
  --sequence-packing --dynamic-context-parallel --context-parallel-size 2 \
  --max-seqlen-per-dp-cp-rank 128

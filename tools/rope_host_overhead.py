"""THD RoPE's host overhead on CPU: one table per micro-batch against megatron-core's RoPE.

    python tools/rope_host_overhead.py [--rounds 21] [--out results/rope/rope_host_overhead.json]

A GPT layer stack with a tiny hidden size (compute is negligible; what the host dispatches
dominates) runs forward + backward on packs of the same number of tokens cut into more and more
sequences, with RoPE from one table per micro-batch (``megatron/varlen/attention/packed_rope.py``)
and with megatron-core 0.16.1's own THD RoPE (per layer, for q and k: the boundaries read with
``.tolist()``, a slice per sequence, a cat, cos and sin of the result). The two paths run in
alternating rounds on one gloo rank with one intra-op thread; the medians of the rounds' times and
of their ratios are reported. The flash core attention's one kernel call is replaced by a fixed-cost
stand-in (``tests/harness/rope_paths.py``): on the GPU it is one call whatever the pack, while its
CPU twin loops over sequences and would bury the difference. The aten ops one attention layer
dispatches (forward + backward, after the micro-batch's first layer built its plan and table) are
counted too. CPU times say nothing about a GPU step; they show how the host work scales.
"""

from __future__ import annotations

if not __package__:  # run as `python tools/X.py`: the repository root on sys.path
    import _repo_root  # noqa: F401

import argparse
import json
import statistics
import time
from pathlib import Path

LAYERS, HIDDEN, HEADS, KV_GROUPS, VOCAB = 4, 64, 4, 2, 128
TOKENS = 4096
SEQUENCE_COUNTS = (16, 256, 1024)
ROUNDS = 21
MODEL_SEED = 1
PATHS = {"one table": True, "megatron-core": False}
MS = 1e3


def _step(model, tokens, positions, params):
    loss = model(tokens, positions, None, labels=tokens, packed_seq_params=params)
    loss.sum().backward()


def _pack_inputs(sequences: int):
    import torch

    from tests.harness.rope_paths import equal_pack
    params = equal_pack(sequences, TOKENS)
    gen = torch.Generator().manual_seed(sequences)
    tokens = torch.randint(0, VOCAB, (1, TOKENS), generator=gen)
    positions = torch.arange(TOKENS // sequences).repeat(sequences)[None]
    return tokens, positions, params


def _timed_rounds(model, sequences: int, rounds: int) -> tuple[dict[str, float], float]:
    """Median milliseconds of one forward + backward per path, and the median of the rounds'
    megatron-core / one-table ratios (alternating rounds: a ratio holds when the shared
    machine's speed drifts)."""
    from tests.harness.rope_paths import use_one_table
    times = {name: [] for name in PATHS}
    for _ in range(rounds + 1):  # the first round warms up and is dropped
        for name, on in PATHS.items():
            use_one_table(model, on)
            tokens, positions, params = _pack_inputs(sequences)  # a fresh micro-batch
            start = time.perf_counter()
            _step(model, tokens, positions, params)
            times[name].append(time.perf_counter() - start)
    ratios = [old / new for old, new in zip(times["megatron-core"][1:], times["one table"][1:])]
    return ({name: statistics.median(t[1:]) * MS for name, t in times.items()},
            statistics.median(ratios))


def _layer_op_counts(model, sequences: int) -> dict[str, int]:
    from tests.harness.rope_paths import SCALAR_READ, layer_ops
    layer = model.decoder.layers[0].self_attention
    freqs = model.rotary_pos_emb(TOKENS, packed_seq=True)
    counts = {}
    for name, on in PATHS.items():
        layer.rope_from_one_table = on
        ops = layer_ops(layer, freqs, _pack_inputs(sequences)[2], TOKENS, HIDDEN)
        counts[name] = sum(ops.values())
        counts[f"{name} scalar reads"] = ops.get(SCALAR_READ, 0)
    layer.rope_from_one_table = True
    return counts


def rank_measure(rounds: int) -> list[dict]:
    from megatron.core import parallel_state

    from tests.harness.rope_paths import build_gpt, use_fixed_cost_kernel
    parallel_state.initialize_model_parallel()
    try:
        model = build_gpt(LAYERS, HIDDEN, HEADS, KV_GROUPS, VOCAB, TOKENS, MODEL_SEED,
                          attention_backend="flash")
        use_fixed_cost_kernel(model)
        rows = []
        for sequences in SEQUENCE_COUNTS:
            ms, ratio = _timed_rounds(model, sequences, rounds)
            rows.append(dict(sequences=sequences, ms=ms, ratio=ratio,
                             layer_ops=_layer_op_counts(model, sequences)))
        return rows
    finally:
        parallel_state.destroy_model_parallel()


def render(rows: list[dict]) -> str:
    lines = [f"{LAYERS} layers, hidden {HIDDEN}, {TOKENS} tokens a pack, forward + backward "
             f"(medians of the rounds: ms, and the rounds' ratios); aten ops of one attention "
             f"layer's forward + backward",
             "",
             "| sequences | one table ms | megatron-core ms | megatron-core / one table "
             "| layer ops one table | layer ops megatron-core (scalar reads) |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        ops = row["layer_ops"]
        lines.append(
            f"| {row['sequences']} | {row['ms']['one table']:.1f} | "
            f"{row['ms']['megatron-core']:.1f} | {row['ratio']:.2f}x | {ops['one table']} | "
            f"{ops['megatron-core']} ({ops['megatron-core scalar reads']}) |")
    return "\n".join(lines)


def main() -> None:
    from tests.harness.multirank import run_distributed
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="timed rounds per path")
    parser.add_argument("--out", type=Path, default=None, help="also write the rows as JSON")
    cli = parser.parse_args()
    rows = run_distributed(rank_measure, world_size=1, args=(cli.rounds,), timeout_s=1800)[0]
    print(render(rows))
    if cli.out is not None:
        cli.out.parent.mkdir(parents=True, exist_ok=True)
        cli.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()

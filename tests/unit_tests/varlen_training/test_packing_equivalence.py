"""Packing never changes the numbers: packed THD == unpacked padded, iterations 1-5.

Same mock SFT data (lognormal lengths, odd ones included) and seed, fp32, dropout 0. The
unpacked run pads every sample to --seq-length and uses per-sample causal attention; the packed
runs schedule, reroute, pack and (with CP) split sequences per rank. Reference: one unpacked
run (layouts are proven equal to a single rank in test_layout_equivalence.py). The runs of each
world size share one launch, one trainer after another (a launch costs more than a run).
"""

import json

import pytest

from tests.harness.multirank import run_distributed
from tests.harness.training_runs import loss_owner_history, train_each_on_this_rank

RTOL = 1e-5
NUM_ITERS = 5
LENGTHS = json.dumps({"mode": "distribution", "type": "lognormal", "min_seq_len": 1,
                      "max_seq_len": 64, "mean_seq_len": 20, "lognormal_sigma": 1.0})
COMMON = [
    "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
    "--seq-length", "64", "--global-batch-size", "8", "--train-iters", str(NUM_ITERS),
    "--lr", "2e-3", "--mock-data", "--sft", "--sft-mock-dataset-config-json", LENGTHS,
    "--tokenizer-type", "NullTokenizer", "--vocab-size", "128",
    "--make-vocab-size-divisible-by", "32", "--hidden-dropout", "0", "--attention-dropout", "0",
    "--position-embedding-type", "rope", "--log-interval", "1", "--eval-iters", "0",
    "--seed", "11", "--calculate-per-token-loss",
]
UNPACKED = COMMON + ["--micro-batch-size", "2"]
PACKED = COMMON + ["--micro-batch-size", "1", "--sequence-packing"]
LAYOUTS = {
    "dp2": ([], 2),
    "dp2_cp2": (["--context-parallel-size", "2"], 4),
    "tp2_dp2": (["--tensor-model-parallel-size", "2"], 4),
    "pp2_dp2": (["--pipeline-model-parallel-size", "2"], 4),
}
EVALUATION = ["--eval-iters", "2", "--eval-interval", "2", "--train-iters", "2"]
DYNAMIC_CP = ["--dynamic-context-parallel", "--context-parallel-size", "2",
              "--max-seqlen-per-dp-cp-rank", "16"]
# Runs that write --log-metrics-jsonl (the token counts below read it back).
METRICS_RUNS = ("unpacked", "dp2_cp2")
WORLDS = (2, 4)


def _runs(metrics_dir) -> dict[int, dict[str, list[str]]]:
    """Every run of this file by world size: each world's runs share one launch."""
    runs = {
        "unpacked": (UNPACKED, 2),
        **{layout: (PACKED + extra, world) for layout, (extra, world) in LAYOUTS.items()},
        "validation_unpacked": (UNPACKED + EVALUATION, 2),
        "validation_dynamic_cp": (PACKED + DYNAMIC_CP + EVALUATION, 4),
    }
    by_world = {world: {} for world in WORLDS}
    for name, (argv, world) in runs.items():
        if name in METRICS_RUNS:
            argv = argv + ["--log-metrics-jsonl", str(metrics_dir / f"{name}.jsonl")]
        by_world[world][name] = argv
    return by_world


@pytest.fixture(scope="module")
def metrics_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("packing_metrics")


@pytest.fixture(scope="module")
def histories(metrics_dir) -> dict[str, list[dict]]:
    """{run name: the loss owner's history}, from one launch per world size."""
    out = {}
    for world, argvs in _runs(metrics_dir).items():
        per_rank = run_distributed(train_each_on_this_rank, world, args=(argvs,),
                                   timeout_s=300)
        for name in argvs:
            out[name] = loss_owner_history([rank[name] for rank in per_rank])
    return out


def _losses(history):
    return [h["lm_loss"] for h in history]


@pytest.fixture(scope="module")
def unpacked(histories):
    return _losses(histories["unpacked"])


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_packed_matches_unpacked(histories, unpacked, layout):
    packed = _losses(histories[layout])
    assert len(packed) == NUM_ITERS
    for it, (got, ref) in enumerate(zip(packed, unpacked), start=1):
        assert abs(got - ref) <= RTOL * abs(ref), (
            f"{layout} iteration {it}: packed {got!r} vs unpacked {ref!r}")


def test_losses_move(unpacked):
    assert len(set(unpacked)) == NUM_ITERS, unpacked  # a frozen run would compare trivially


def test_validation_loss_packed_matches_unpacked(histories):
    unpacked = histories["validation_unpacked"][-1]["validation_loss"]
    packed = histories["validation_dynamic_cp"][-1]["validation_loss"]
    assert unpacked is not None and abs(packed - unpacked) <= RTOL * unpacked, (packed, unpacked)


def test_token_counts_agree_with_the_dataset(histories, metrics_dir):
    """sum(L) and sum(L^2) per iteration: unpacked DP2 (all-reduced), packed DP2xCP2 (gathered)
    and a direct read of the dataset in this process must all agree, exactly; the throughput
    per GPU divides the global batch's FLOPs by all ranks, as Megatron-LM's world size."""
    from megatron.varlen_training.flops import num_floating_point_operations

    from megatron.varlen_training.config.from_flags import parse_run_config
    from megatron.varlen_training.datasets.builder import build_datasets
    from megatron.varlen_training.tokenizer import build_tokenizer

    def sums(argv, world, name):
        assert histories[name], name  # the run behind the file has finished
        path = metrics_dir / f"{name}.jsonl"
        records = [json.loads(line) for line in path.read_text().splitlines()]
        model = parse_run_config(argv, world_size=world).model
        for r in records:  # per GPU: the global batch's FLOPs over time x EVERY rank (CP too)
            flops = num_floating_point_operations(model, r["seqlen_sum"], r["seqlen_squared_sum"])
            assert r["tflops_per_device"] == pytest.approx(
                flops / (r["step_time_s"] * world * 1e12), rel=1e-9)
        return [(r["seqlen_sum"], r["seqlen_squared_sum"]) for r in records]

    run = parse_run_config(UNPACKED, world_size=1)
    # train_samples / eval_samples: derived during validation (run_description.py)
    dataset, _ = build_datasets(run, build_tokenizer(run.data.tokenizer_type,
                                                     run.model.vocab_size))
    gbs = run.training.global_batch_size
    expected = []
    for it in range(NUM_ITERS):
        lengths = [dataset[i]["length"] for i in range(it * gbs, (it + 1) * gbs)]
        expected.append((sum(lengths), sum(n * n for n in lengths)))
    assert sums(UNPACKED, 2, "unpacked") == expected
    assert sums(PACKED + LAYOUTS["dp2_cp2"][0], 4, "dp2_cp2") == expected

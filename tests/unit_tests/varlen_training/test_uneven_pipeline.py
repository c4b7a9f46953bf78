"""Uneven pipeline stages train the same model as one rank: PP2 with fixed first/last stage
sizes, with the embedding or the loss counted as a layer, with virtual stages
(--num-virtual-stages-per-pipeline-rank; also a chunk left with the embedding alone), with MTP,
MoE, the hybrid Mamba stack (also split by | in its pattern), and placed by
--pipeline-model-parallel-layout (also with MTP, and with virtual stages run in a non-default
--microbatch-group-size-per-virtual-pipeline-stage, unpacked and packed: the packed step's
micro-batch counts are multiples of the group).

Reference: the single-rank unpacked run of the same flags (no split), a separate launch. Every
iteration's lm loss and grad norm, and the last step's gradient of every parameter (named by
its layout-free name: global layer numbers), agree within float32 rounding. Each uneven run
also checks the layers each stage built against megatron-core's own placement
(pipeline_layout.py), so an even split in disguise cannot pass.

Two launches (1 rank: the references; 2 ranks: the uneven runs), each running its cases in
sequence (start-up dominates on 2 shared cores).
"""

import pytest
import torch

from tests.harness.multirank import run_distributed
from tests.harness.training_runs import TINY_GPT_ARGS

RTOL = 1e-5
GRAD_ATOL = 1e-6  # float32 rounding of gradients of order 1e-2 summed in another order
NUM_ITERS = 3
LAUNCH_TIMEOUT_S = 420
PP2 = ["--pipeline-model-parallel-size", "2"]
ROPE = ["--position-embedding-type", "rope"]
L5 = TINY_GPT_ARGS + ["--train-iters", str(NUM_ITERS), "--num-layers", "5"] + ROPE
L6 = TINY_GPT_ARGS + ["--train-iters", str(NUM_ITERS), "--num-layers", "6",
                      "--global-batch-size", "8"] + ROPE
L3 = TINY_GPT_ARGS + ["--train-iters", str(NUM_ITERS), "--num-layers", "3",
                      "--global-batch-size", "8"] + ROPE
MTP = ["--mtp-num-layers", "1"]
LAYOUT = "--pipeline-model-parallel-layout"
PER_TOKEN = ["--calculate-per-token-loss"]  # the loss packing leaves unchanged
PACKED = ["--sequence-packing", "--micro-batch-size", "1"]
MICROBATCH_GROUP = "--microbatch-group-size-per-virtual-pipeline-stage"
MOE = ["--num-experts", "2", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "16",
       "--disable-bias-linear"]
HYBRID = TINY_GPT_ARGS + ["--train-iters", str(NUM_ITERS), "--num-layers", "4",
                          "--hybrid-override-pattern", "M*M*", "--mamba-head-dim", "4",
                          "--mamba-num-groups", "2", "--mamba-state-dim", "8"] + ROPE
# The same hybrid model, its stages given by | in the pattern and --num-layers left to it
# (Megatron-LM main): TINY_GPT_ARGS without its --num-layers
_TINY_WITHOUT_DEPTH = [arg for index, arg in enumerate(TINY_GPT_ARGS)
                       if "--num-layers" not in TINY_GPT_ARGS[max(index - 1, 0):index + 1]]
HYBRID_PIPES = _TINY_WITHOUT_DEPTH + ["--train-iters", str(NUM_ITERS),
                                      "--hybrid-layer-pattern", "M|*M*", "--mamba-head-dim", "4",
                                      "--mamba-num-groups", "2", "--mamba-state-dim", "8"] + ROPE

# name -> (reference name, uneven argv, hybrid)
CASES = {
    "first 2 of 5": ("l5", L5 + PP2 + ["--decoder-first-pipeline-num-layers", "2"], False),
    "last 1 of 5": ("l5", L5 + PP2 + ["--decoder-last-pipeline-num-layers", "1"], False),
    "embedding counted": ("l5", L5 + PP2 + ["--account-for-embedding-in-pipeline-split"], False),
    "loss counted": ("l5", L5 + PP2 + ["--account-for-loss-in-pipeline-split"], False),
    "first 1 of 5, MTP": ("l5 mtp", L5 + MTP + PP2 + ["--decoder-first-pipeline-num-layers", "1"],
                          False),
    "last 1 of 5, MoE": ("l5 moe", L5 + MOE + PP2 + ["--decoder-last-pipeline-num-layers", "1"],
                         False),
    "first 2 of 6, VPP 2": ("l6", L6 + PP2 + ["--decoder-first-pipeline-num-layers", "2",
                                              "--num-virtual-stages-per-pipeline-rank", "2"],
                            False),
    # 3 layers + the embedding over 2 stages x 2 virtual stages: the first chunk holds only
    # the embedding (no decoder layer), as megatron-core places it
    "embedding counted, VPP 2": ("l3", L3 + PP2 + ["--account-for-embedding-in-pipeline-split",
                                                   "--num-virtual-stages-per-pipeline-rank",
                                                   "2"], False),
    "hybrid first 1 of 4": ("hybrid", HYBRID + PP2 + ["--decoder-first-pipeline-num-layers", "1"],
                            True),
    "hybrid pattern stages 1 | 3": ("hybrid", HYBRID_PIPES + PP2, True),
    # --pipeline-model-parallel-layout: megatron-core's layout string places the layers
    "layout 1 | 4": ("l5", L5 + PP2 + [LAYOUT, "Et|ttttL"], False),
    "layout 3 | 2, MTP": ("l5 mtp", L5 + MTP + PP2 + [LAYOUT, "E,t*3|ttmL"], False),
    # 4 virtual stages in schedule order (rank 0: E, tt; rank 1: ttt, tL), a non-default
    # micro-batch group (4 of the step's 4 micro-batches; default: PP = 2)
    "layout VPP 2, group 4": ("l6", L6 + PP2 + [LAYOUT, "E|ttt|tt|tL", MICROBATCH_GROUP, "4"],
                              False),
    # packed: the packer rounds each step's micro-batch count up to a multiple of the group
    # (3 is none of PP 2's multiples: the default group would not pass the count check)
    "layout VPP 2, group 3, packed": ("l6 per token", L6 + PER_TOKEN + PACKED + PP2 + [
        LAYOUT, "E|ttt|tt|tL", MICROBATCH_GROUP, "3"], False),
}
REFERENCES = {"l5": (L5, False), "l5 mtp": (L5 + MTP, False), "l5 moe": (L5 + MOE, False),
              "l6": (L6, False), "l6 per token": (L6 + PER_TOKEN, False), "l3": (L3, False),
              "hybrid": (HYBRID, True)}


def _train(argv: list[str], hybrid: bool) -> dict:
    """Trains on this rank; returns its metrics, the last step's gradients by layout-free name,
    and the global layer numbers of the decoder layers each of its chunks built."""
    from megatron.varlen_training.config.from_flags import (
        parse_hybrid_run_config, parse_run_config,
    )
    from megatron.varlen_training.hybrid_model import HYBRID as HYBRID_FAMILY
    from megatron.varlen_training.layout_invariant_init import canonical_parameter_name
    from megatron.varlen_training.model import unwrap
    from megatron.varlen_training.model_family import GPT
    from megatron.varlen_training.pretrain import pretrain
    from megatron.varlen_training.trainer import Trainer

    parse = parse_hybrid_run_config if hybrid else parse_run_config
    run = parse(argv, world_size=torch.distributed.get_world_size())
    trainer = Trainer(run, HYBRID_FAMILY if hybrid else GPT, console=False)
    counts, step = [], trainer.step  # each step's micro-batch count, as the schedule ran it

    def counting_step(batches, **kwargs):
        counts.append(batches.num_microbatches)
        return step(batches, **kwargs)

    trainer.step = counting_step
    try:
        history = pretrain(trainer)
        grads, layers = {}, []
        for chunk in trainer.state.model:
            module = unwrap(chunk)
            decoder = getattr(module, "decoder", None)
            layers.append([layer.layer_number for layer in decoder.layers])
            for name, param in module.named_parameters():
                key = canonical_parameter_name(module, name, run.model.tied_output)
                grads[key] = param.main_grad.detach().clone()
        return {"history": [{k: step[k] for k in ("lm_loss", "grad_norm")} for step in history],
                "num_microbatches": counts,
                "owns_loss": bool(history) and history[0]["lm_loss"] is not None,
                "grads": grads, "layers": layers}
    finally:
        trainer.close()


def _train_all(plan: dict) -> dict:
    return {name: _train(argv, hybrid) for name, (argv, hybrid) in plan.items()}


@pytest.fixture(scope="module")
def runs() -> dict:
    references = run_distributed(_train_all, 1, args=(REFERENCES,),
                                 timeout_s=LAUNCH_TIMEOUT_S)[0]
    plan = {name: (argv, hybrid) for name, (_, argv, hybrid) in CASES.items()}
    ranks = run_distributed(_train_all, 2, args=(plan,), timeout_s=LAUNCH_TIMEOUT_S)
    return {"references": references, "ranks": ranks}


def _flag_value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def _expected_layers(argv: list[str], hybrid: bool) -> list[list[list[int]]]:
    """megatron-core's placement of the flags' split: 1-based global layer numbers per rank
    and chunk."""
    from megatron.varlen_training.config.from_flags import (
        parse_hybrid_run_config, parse_run_config,
    )
    from megatron.varlen_training.pipeline_layout import PipelineSplit

    run = (parse_hybrid_run_config if hybrid else parse_run_config)(argv, world_size=2)
    parallel = run.parallel
    split = PipelineSplit(
        num_layers=run.model.num_layers,
        pipeline_model_parallel_size=parallel.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=parallel.virtual_pipeline_model_parallel_size,
        num_layers_in_first_pipeline_stage=parallel.decoder_first_pipeline_num_layers,
        num_layers_in_last_pipeline_stage=parallel.decoder_last_pipeline_num_layers,
        account_for_embedding_in_pipeline_split=parallel.account_for_embedding_in_pipeline_split,
        account_for_loss_in_pipeline_split=parallel.account_for_loss_in_pipeline_split,
        pipeline_model_parallel_layout=parallel.pipeline_model_parallel_layout)
    return [[list(range(offset + 1, offset + count + 1)) for offset, count in zip(offs, counts)]
            for offs, counts in zip(split.chunk_offsets(), split.chunk_layers())]


@pytest.mark.parametrize("case", sorted(CASES))
def test_uneven_stages_train_as_one_rank(runs, case):
    reference_name, argv, hybrid = CASES[case]
    reference = runs["references"][reference_name]
    ranks = [rank[case] for rank in runs["ranks"]]
    assert [rank["layers"] for rank in ranks] == _expected_layers(argv, hybrid)
    stage_sizes = [sum(map(len, rank["layers"])) for rank in ranks]
    assert len(set(stage_sizes)) > 1, f"{case}: stages {stage_sizes} are even"
    history = [rank for rank in ranks if rank["owns_loss"]][-1]["history"]
    assert len(history) == NUM_ITERS
    group = _flag_value(argv, MICROBATCH_GROUP)
    if group is not None:  # the schedule ran groups of that many micro-batches
        counts = ranks[0]["num_microbatches"]
        assert all(count % int(group) == 0 for count in counts), (case, counts)
    for it, (got, want) in enumerate(zip(history, reference["history"]), start=1):
        for key in ("lm_loss", "grad_norm"):
            assert got[key] == pytest.approx(want[key], rel=RTOL), (case, it, key)
    grads = {name: grad for rank in ranks for name, grad in rank["grads"].items()}
    assert grads.keys() == reference["grads"].keys()
    for name, want in reference["grads"].items():
        torch.testing.assert_close(grads[name], want, rtol=RTOL, atol=GRAD_ATOL,
                                   msg=lambda m, name=name: f"{case} {name}: {m}")


def _run_config(extra: list[str]):
    from megatron.varlen_training.config.from_flags import parse_run_config

    return parse_run_config(L5 + PP2 + extra, world_size=2)


def test_distributed_optimizer_state_does_not_follow_a_split_change(tmp_path):
    """--use-distributed-optimizer's state (dp_reshardable) holds each stage's buffers as
    saved: another split of the same PP size is refused in one line naming the flag; the
    weights (--no-load-optim) and Adam's per-parameter state reshard (the resume test in
    test_resume_layout_change.py)."""
    from megatron.varlen_training.errors import CheckpointError
    from megatron.varlen_training.load_options import LoadParts
    from megatron.varlen_training.resume.consistency import check_run_args
    from megatron.varlen_training.resume.run_args_record import save_run_args

    dist_opt = ["--use-distributed-optimizer"]
    save_run_args(str(tmp_path), _run_config(dist_opt + ["--decoder-first-pipeline-num-layers",
                                                         "2"]))
    same = _run_config(dist_opt + ["--decoder-first-pipeline-num-layers", "2"])
    assert check_run_args(str(tmp_path), same, check_data=False) is None
    other = _run_config(dist_opt + ["--account-for-loss-in-pipeline-split"])
    with pytest.raises(CheckpointError, match="--decoder-first-pipeline-num-layers 2") as err:
        check_run_args(str(tmp_path), other, check_data=False)
    assert "\n" not in str(err.value) and "--no-load-optim" in str(err.value)
    weights_only = LoadParts(optimizer=False)
    assert check_run_args(str(tmp_path), other, check_data=False, parts=weights_only) is None


@pytest.mark.parametrize("extra, world, needle", [
    (["--decoder-first-pipeline-num-layers", "2", "--decoder-last-pipeline-num-layers", "2"],
     2, "add up to 4 layers, not --num-layers 5"),
    (["--decoder-first-pipeline-num-layers", "5"], 2,
     "0 of --num-layers 5 are left for the other 1 pipeline stage(s)"),
    (["--decoder-first-pipeline-num-layers", "2"], 1, "needs --pipeline-model-parallel-size > 1"),
    (["--decoder-first-pipeline-num-layers", "0"], 2, "--decoder-first-pipeline-num-layers"),
    (["--decoder-last-pipeline-num-layers", "1", "--account-for-embedding-in-pipeline-split"],
     2, "cannot combine fixed first/last stage sizes"),
    (["--decoder-first-pipeline-num-layers", "1", "--num-layers-per-virtual-pipeline-stage",
      "1"], 2, "take the virtual pipeline size from --num-virtual-stages-per-pipeline-rank"),
    (["--decoder-first-pipeline-num-layers", "1", "--num-virtual-stages-per-pipeline-rank",
      "2"], 2, "--decoder-first-pipeline-num-layers 1 is not divisible by the virtual"),
    (["--num-layers-per-virtual-pipeline-stage", "1", "--num-virtual-stages-per-pipeline-rank",
      "2"], 2, "both set the virtual pipeline size"),
    (["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"], 2,
     "--num-layers 5 + 1 for each of --account-for-embedding-in-pipeline-split and "
     "--account-for-loss-in-pipeline-split is not divisible by --pipeline-model-parallel-size"),
    (["--num-virtual-stages-per-pipeline-rank", "2"], 1, "needs --pipeline-model-parallel-size"),
])
def test_bad_splits_are_one_line_errors(extra, world, needle):
    from megatron.varlen_training.arguments import ArgumentValidationError, parse_args

    pp = PP2 if world == 2 else []
    with pytest.raises(ArgumentValidationError) as err:
        parse_args(L5 + pp + extra, world_size=world)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_hybrid_refuses_the_embedding_or_loss_in_the_split():
    """megatron-core's hybrid stack splits its layer pattern without them (Megatron-LM refuses
    them with a hybrid pattern)."""
    from megatron.varlen_training.arguments import ArgumentValidationError
    from megatron.varlen_training.hybrid_arguments import parse_hybrid_args

    with pytest.raises(ArgumentValidationError, match="--account-for-loss-in-pipeline-split"):
        parse_hybrid_args(HYBRID + PP2 + ["--account-for-loss-in-pipeline-split"], world_size=2)


def test_entry_point_prints_one_line_and_exits_2():
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, str(repo / "pretrain_gpt.py"), *L5, "--decoder-first-pipeline-num-layers",
         "2"], capture_output=True, text=True, cwd=repo, timeout=120)
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert errors == ["pretrain_gpt.py: error: --decoder-first-pipeline-num-layers 2 needs "
                      "--pipeline-model-parallel-size > 1 (one stage holds every layer)"]


def test_memory_check_counts_each_end_stage_its_own_layers():
    """The start-up memory bound gives the first and the last stage their own layer counts
    (2 and 3 of 5 here), not 5 / PP each: with uneven stages the average would overstate the
    smaller stage and understate the larger one."""
    from megatron.varlen_training import flag_ranges
    from megatron.varlen_training.arguments import parse_args

    args = parse_args(L5 + PP2 + ["--decoder-first-pipeline-num-layers", "2"], world_size=2)
    stack = args.num_layers * flag_ranges.gpt_layer_parameters(args)
    first, last = flag_ranges.stage_memory_parts(args, stack)
    fp32_bytes = 4
    assert first[0].nbytes == stack * 2 // 5 * fp32_bytes
    assert last[0].nbytes == stack * 3 // 5 * fp32_bytes


@pytest.mark.parametrize("recompute, needle", [
    (["uniform", "2"], "--recompute-num-layers 2 does not divide the 3 layers of a model chunk"),
    (["uniform", "1"], None),
    (["block", "3"], None),  # two layers of the first stage, three of the last recomputed
    (["block", "4"], "--recompute-num-layers 4 exceeds the 3 layers of the largest model chunk"),
])
def test_full_recomputation_is_checked_against_every_stage(recompute, needle):
    """megatron-core recomputes each chunk's own layers: "uniform" groups must divide every
    chunk (it would index past a chunk they do not divide), "block" may exceed the smaller."""
    from megatron.varlen_training.arguments import ArgumentValidationError, parse_args

    argv = L5 + PP2 + ["--decoder-first-pipeline-num-layers", "2", "--recompute-granularity",
                       "full", "--recompute-method", recompute[0], "--recompute-num-layers",
                       recompute[1]]
    if needle is None:
        assert parse_args(argv, world_size=2).recompute_num_layers == int(recompute[1])
        return
    with pytest.raises(ArgumentValidationError) as err:
        parse_args(argv, world_size=2)
    assert needle in str(err.value)

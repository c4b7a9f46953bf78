"""--pipeline-model-parallel-layout and --microbatch-group-size-per-virtual-pipeline-stage at
start-up (the training runs equal to one rank are in test_uneven_pipeline.py).

Reference for the placement: megatron-core itself (``get_num_layers_to_build`` and
``get_transformer_layer_offset`` of a TransformerConfig, asked rank by rank with parallel_state's
pipeline rank and virtual size set, as the model build asks them). The refusals follow Megatron-LM's
validate_args and megatron-core's layout checks, each one line naming the flag.
"""

import pytest
import torch

from megatron.varlen_training.arguments import ArgumentValidationError, parse_args
from tests.harness.training_runs import TINY_GPT_ARGS

LAYOUT = "--pipeline-model-parallel-layout"
GROUP = "--microbatch-group-size-per-virtual-pipeline-stage"
PP2 = ["--pipeline-model-parallel-size", "2"]
# 4 layers, global batch 8 of micro-batches of 2: 4 micro-batches a step at DP 1
L4 = TINY_GPT_ARGS + ["--train-iters", "1", "--num-layers", "4", "--global-batch-size", "8",
                      "--position-embedding-type", "rope"]


def _core_placement(pp: int, vpp: int | None, num_layers: int, **split) -> list:
    """``[pp_rank][vp_stage]``: (offset, layers) of each chunk, asked of megatron-core."""
    from megatron.core import parallel_state
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    config = TransformerConfig(num_layers=num_layers, hidden_size=8, num_attention_heads=2,
                               pipeline_model_parallel_size=pp,
                               virtual_pipeline_model_parallel_size=vpp,
                               pipeline_dtype=torch.float32,
                               **split)
    parallel_state.set_virtual_pipeline_model_parallel_world_size(
        config.virtual_pipeline_model_parallel_size)
    try:
        placement = []
        for rank in range(pp):
            parallel_state.set_pipeline_model_parallel_rank(rank)
            stages = [None] if config.virtual_pipeline_model_parallel_size is None \
                else range(config.virtual_pipeline_model_parallel_size)
            placement.append([(get_transformer_layer_offset(config, vp_stage=vp),
                               get_num_layers_to_build(config, vp_stage=vp)) for vp in stages])
        return placement
    finally:
        parallel_state.set_pipeline_model_parallel_rank(None)
        parallel_state.set_virtual_pipeline_model_parallel_world_size(None)


def _our_placement(argv: list[str], world_size: int) -> list:
    from megatron.varlen_training.pipeline_arguments import pipeline_split_of

    split = pipeline_split_of(parse_args(argv, world_size=world_size))
    return [list(zip(offsets, counts))
            for offsets, counts in zip(split.chunk_offsets(), split.chunk_layers())]


@pytest.mark.parametrize("layers, pp, layout", [
    (5, 2, "Et|ttttL"),
    (6, 2, "E|ttt|tt|tL"),           # virtual stages: rank 0 holds E and tt, rank 1 ttt and tL
    (6, 4, "Et|(tt|)*2,tL"),          # megatron-core's repeat grammar
    (4, 2, "E|tt|tt|L"),              # chunks holding only the embedding / only the loss
])
def test_layout_placement_is_megatron_cores(layers, pp, layout):
    """The per-stage layer counts the flags, the scheduler's bounds and the tests use equal
    megatron-core's own placement of the layout."""
    argv = TINY_GPT_ARGS + ["--train-iters", "1", "--num-layers", str(layers),
                            "--pipeline-model-parallel-size", str(pp), LAYOUT, layout]
    assert _our_placement(argv, pp) == _core_placement(
        pp, None, layers, pipeline_model_parallel_layout=layout)


@pytest.mark.parametrize("layout, virtual_flags", [
    ("Ett|ttL", []),
    ("Et|t|t|tL", ["--num-layers-per-virtual-pipeline-stage", "1"]),
])
def test_a_layout_of_the_even_split_places_as_no_layout(layout, virtual_flags):
    """megatron-core's offsets and counts of the even split, with and without the layout."""
    with_layout = parse_args(L4 + PP2 + [LAYOUT, layout], world_size=2)
    without = parse_args(L4 + PP2 + virtual_flags, world_size=2)
    vpp = without.virtual_pipeline_model_parallel_size
    assert with_layout.virtual_pipeline_model_parallel_size == vpp
    even = _core_placement(2, vpp, 4)
    assert _core_placement(2, vpp, 4, pipeline_model_parallel_layout=layout) == even
    assert _our_placement(L4 + PP2 + [LAYOUT, layout], 2) == even


def test_scheduler_memory_bound_takes_the_layouts_stage_sizes():
    """The start-up memory bound gives each end stage the layers the layout puts there (1 and
    3 of 4), as with the uneven-stage flags."""
    from megatron.varlen_training import flag_ranges

    args = parse_args(L4 + PP2 + [LAYOUT, "Et|tttL"], world_size=2)
    stack = args.num_layers * flag_ranges.gpt_layer_parameters(args)
    first, last = flag_ranges.stage_memory_parts(args, stack)
    fp32_bytes = 4
    assert first[0].nbytes == stack * 1 // 4 * fp32_bytes
    assert last[0].nbytes == stack * 3 // 4 * fp32_bytes


@pytest.mark.parametrize("extra, world, needle", [
    ([LAYOUT, "Et|tt|tL"], 2,
     "has 3 stages, not a multiple of --pipeline-model-parallel-size 2"),
    ([LAYOUT, "Ex|tttL"], 2, "Invalid layer character: x"),
    ([LAYOUT, "Ett|tL"], 2, "places 3 layers 't' but --num-layers is 4"),
    ([LAYOUT, "Ett|ttmL"], 2, "places 1 layers 'm' but --mtp-num-layers is 0"),
    ([LAYOUT, "tEt|ttL"], 2, "The first layer must be embedding"),
    ([LAYOUT, "Ett|tLt"], 2, "The last layer must be loss"),
    ([LAYOUT, "Ett|ttL", "--mtp-num-layers", "1"], 2,
     "places 0 layers 'm' but --mtp-num-layers is 1"),
    ([LAYOUT, "Ett|m|tt|L", "--mtp-num-layers", "1"], 2,
     "decoder layers must be placed before MTP layers"),
    ([LAYOUT, "Ett|tt|m|L", "--mtp-num-layers", "1"], 2,
     "standalone MTP stages are not built here"),
    ([LAYOUT, "Ett|ttL", "--decoder-first-pipeline-num-layers", "2"], 2,
     "the layout places every layer itself"),
    ([LAYOUT, "Ett|ttL", "--account-for-loss-in-pipeline-split"], 2,
     "the layout places every layer itself"),
    ([LAYOUT, "Et|t|t|tL", "--num-layers-per-virtual-pipeline-stage", "1"], 2,
     "both set the virtual pipeline size"),
    ([LAYOUT, "Ett|ttL"], 1, "has 2 stages: virtual pipeline stages need "
                             "--pipeline-model-parallel-size > 1"),
    ([LAYOUT, "Et|t|t|tL", "--no-overlap-p2p-communication"], 2,
     "needs --pipeline-model-parallel-size > 2 (got 2)"),
])
def test_bad_layouts_are_one_line_errors(extra, world, needle):
    pp = PP2 if world == 2 else []
    with pytest.raises(ArgumentValidationError) as err:
        parse_args(L4 + pp + extra, world_size=world)
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert "--pipeline-model-parallel" in str(err.value)


def test_layout_sets_the_virtual_pipeline_size_as_megatron_lm():
    """Stages / PP; one stage per rank is no virtual pipeline (None), as for
    --num-layers-per-virtual-pipeline-stage equal to a stage's layers."""
    assert parse_args(L4 + PP2 + [LAYOUT, "Ett|ttL"], world_size=2) \
        .virtual_pipeline_model_parallel_size is None
    assert parse_args(L4 + PP2 + [LAYOUT, "Et|t|t|tL"], world_size=2) \
        .virtual_pipeline_model_parallel_size == 2
    whole_stage = ["--num-layers-per-virtual-pipeline-stage", "2"]
    assert parse_args(L4 + PP2 + whole_stage, world_size=2) \
        .virtual_pipeline_model_parallel_size is None
    assert parse_args(L4 + [LAYOUT, "EttttL"], world_size=1) \
        .virtual_pipeline_model_parallel_size is None  # one stage at PP 1: the plain model


@pytest.mark.parametrize("recompute, needle", [
    (["uniform", "3"], "--recompute-num-layers 3 does not divide the 1 layers of a model chunk"),
    (["block", "4"], "--recompute-num-layers 4 exceeds the 3 layers of the largest model chunk"),
])
def test_full_recomputation_is_checked_against_the_layouts_chunks(recompute, needle):
    """The per-chunk recomputation checks read the layout's chunks (1 and 3 layers here)."""
    argv = L4 + PP2 + [LAYOUT, "Et|tttL", "--recompute-granularity", "full",
                       "--recompute-method", recompute[0], "--recompute-num-layers", recompute[1]]
    with pytest.raises(ArgumentValidationError) as err:
        parse_args(argv, world_size=2)
    assert needle in str(err.value)


VPP = [LAYOUT, "Et|t|t|tL"]


@pytest.mark.parametrize("group, needle", [
    ("1", "--microbatch-group-size-per-virtual-pipeline-stage 1 is below "
          "--pipeline-model-parallel-size 2"),
    ("5", "--microbatch-group-size-per-virtual-pipeline-stage 5 exceeds the 4 micro-batches"),
    ("3", "leaves a last group of 1 of the 4 micro-batches, fewer than "
          "--pipeline-model-parallel-size 2"),
    ("0", "--microbatch-group-size-per-virtual-pipeline-stage"),
])
def test_bad_microbatch_groups_are_one_line_errors(group, needle):
    """megatron-core's interleaved schedule raises these mid-step (ValueError / RuntimeError)."""
    with pytest.raises(ArgumentValidationError) as err:
        parse_args(L4 + PP2 + VPP + [GROUP, group], world_size=2)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_microbatch_group_without_virtual_stages_is_unused():
    """As in Megatron-LM: only the interleaved schedule reads it."""
    args = parse_args(L4 + PP2 + [GROUP, "1"], world_size=2)
    assert args.microbatch_group_size_per_vp_stage == 1


@pytest.mark.parametrize("group, expected", [(None, 2), ("4", 4)])
def test_packed_micro_batch_count_is_a_multiple_of_the_group(group, expected):
    """The packing scheduler rounds a step's micro-batch count up to a multiple of the group
    (megatron-core's default group: the PP size), which megatron-core's schedule then accepts
    for any count; the TransformerConfig gets the same group."""
    from megatron.varlen_training.config.from_flags import parse_run_config
    from megatron.varlen_training.data import build_packing_config
    from megatron.varlen_training.model import build_transformer_config

    packed = ["--sequence-packing", "--micro-batch-size", "1"]
    argv = L4 + PP2 + VPP + packed + ([GROUP, group] if group else [])
    run = parse_run_config(argv, world_size=2)
    assert build_packing_config(run, pad_id=0).vpp_group_size == expected
    assert build_transformer_config(run).microbatch_group_size_per_vp_stage == expected


def test_resume_refuses_another_layout_with_the_distributed_optimizer(tmp_path):
    """run_args.json records the layout like the other split flags: the distributed
    optimizer's state cannot follow another placement (one line naming the flag); the weights
    can (--no-load-optim)."""
    from megatron.varlen_training.config.from_flags import parse_run_config
    from megatron.varlen_training.errors import CheckpointError
    from megatron.varlen_training.load_options import LoadParts
    from megatron.varlen_training.resume.consistency import check_run_args
    from megatron.varlen_training.resume.run_args_record import save_run_args

    def run(layout: str):
        argv = L4 + PP2 + ["--use-distributed-optimizer", LAYOUT, layout]
        return parse_run_config(argv, world_size=2)

    save_run_args(str(tmp_path), run("Et|tttL"))
    assert check_run_args(str(tmp_path), run("Et|tttL"), check_data=False) is None
    with pytest.raises(CheckpointError, match="--pipeline-model-parallel-layout") as err:
        check_run_args(str(tmp_path), run("Ettt|tL"), check_data=False)
    assert "\n" not in str(err.value) and "--no-load-optim" in str(err.value)
    assert check_run_args(str(tmp_path), run("Ettt|tL"), check_data=False,
                          parts=LoadParts(optimizer=False)) is None


def test_hybrid_refuses_the_layout():
    """Megatron-LM: the hybrid pattern's own | separators give its stages, not this flag."""
    from megatron.varlen_training.hybrid_arguments import parse_hybrid_args

    argv = TINY_GPT_ARGS + ["--train-iters", "1", "--num-layers", "2",
                            "--hybrid-layer-pattern", "M*", "--mamba-head-dim", "4",
                            "--mamba-num-groups", "2", "--mamba-state-dim", "8"]
    with pytest.raises(ArgumentValidationError) as err:
        parse_hybrid_args(argv + PP2 + [LAYOUT, "Et|tL"], world_size=2)
    assert LAYOUT in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("pipeline, size", [
    (["--num-layers-per-virtual-pipeline-stage", "1"], 2),
    (["--num-virtual-stages-per-pipeline-rank", "2"], 2),
    ([LAYOUT, "Et|t|t|tL"], 2),
    (["--num-layers-per-virtual-pipeline-stage", "2"], None),  # one virtual stage per rank
    ([], None),
])
def test_start_up_names_the_virtual_pipeline_size_as_megatron_lm(pipeline, size):
    """Megatron-LM core_v0.16.1's validate_args prints 'Number of virtual stages per pipeline
    stage: {args.virtual_pipeline_model_parallel_size}' on every run, whichever flag gave it."""
    from megatron.varlen_training.config.from_flags import parse_run_config
    from megatron.varlen_training.initialize import virtual_stages_line

    run = parse_run_config(L4 + PP2 + pipeline, world_size=2)
    assert virtual_stages_line(run.parallel) == \
        f"Number of virtual stages per pipeline stage: {size}"

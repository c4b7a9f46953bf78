"""pretrain_mamba.py's flags: bad input fails at start-up in one line naming value, limit, flag;
the derived hybrid fields; pretrain_gpt.py's CLI does not change."""

import pytest

from megatron.varlen_training.arguments import ArgumentValidationError, build_parser
from megatron.varlen_training.config.from_flags import hybrid_run_config, run_config
from megatron.varlen_training.hybrid_arguments import (
    build_hybrid_parser, parse_hybrid_args, parse_hybrid_args_or_exit,
)
from megatron.varlen_training.hybrid_model import describe_hybrid_model

BASE = ["--num-layers", "3", "--hidden-size", "24", "--num-attention-heads", "4",
        "--mamba-head-dim", "4", "--mamba-num-groups", "2", "--mamba-state-dim", "8",
        "--seq-length", "64", "--train-iters", "1", "--lr", "1e-3", "--mock-data",
        "--vocab-size", "128"]


def _error(argv, world_size=1):
    with pytest.raises(ArgumentValidationError) as info:
        parse_hybrid_args(BASE + argv, world_size=world_size)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_unknown_pattern_symbol():
    message = _error(["--hybrid-override-pattern", "MXM"])
    assert "'X'" in message and "--hybrid-override-pattern" in message and "M * -" in message


def test_moe_symbol_is_refused():
    assert "MoE" in _error(["--hybrid-override-pattern", "ME*"])


@pytest.mark.parametrize("pattern,modules,expected", [
    ("M*M", ["mlp"], "--recompute-modules mlp recomputes dense MLP layers and "
                     "--hybrid-override-pattern 'M*M' gives this model none"),
    ("M-M", ["core_attn"], "--recompute-modules core_attn recomputes attention layers and "
                           "--hybrid-override-pattern 'M-M' gives this model none; use mlp"),
    ("MMM", ["layernorm"], "--recompute-modules layernorm recomputes attention, MLP or MoE "
                           "layers and --hybrid-override-pattern 'MMM' gives this model none"),
])
def test_recompute_modules_need_layers_of_their_kind(pattern, modules, expected):
    # megatron-core recomputes nothing then (Mamba layers have no selective recomputation)
    flags = ["--hybrid-override-pattern", pattern, "--disable-bias-linear",
             "--recompute-granularity", "selective", "--recompute-modules", *modules]
    assert expected in _error(flags)


def test_recompute_modules_with_layers_of_their_kind_pass():
    args = parse_hybrid_args(BASE + ["--hybrid-override-pattern", "M*-", "--disable-bias-linear",
                                     "--recompute-granularity", "selective",
                                     "--recompute-modules", "core_attn", "mlp", "layernorm"],
                             world_size=1)
    assert args.recompute_modules == ("core_attn", "mlp", "layernorm")


def test_pattern_length_must_match_num_layers():
    message = _error(["--hybrid-override-pattern", "M*-M"])
    assert "4 layers" in message and "--num-layers is 3" in message


def test_heads_must_divide_over_tp_times_cp():
    # 12 heads / TP 2 = 6 per TP rank; CP 4 does not divide 6.
    message = _error(["--hybrid-override-pattern", "M*-", "--tensor-model-parallel-size", "2",
                      "--context-parallel-size", "4"], world_size=8)
    assert "6 per TP rank" in message and "--context-parallel-size 4" in message


def test_dynamic_cp_checks_every_group_size_it_may_pick():
    # 12 heads; DP x CP = 8 gives group sizes up to 8, which does not divide 12.
    message = _error(["--hybrid-override-pattern", "M*-", "--context-parallel-size", "2",
                      "--dynamic-context-parallel", "--max-seqlen-per-dp-cp-rank", "32",
                      "--micro-batch-size", "1"], world_size=8)
    assert "CP group size 8" in message and "[1, 2, 4, 8]" in message


def test_ratios_fill_the_pattern_and_cost_weight():
    args = parse_hybrid_args(BASE + ["--num-layers", "4", "--hybrid-attention-ratio", "0.25"],
                             world_size=1)
    assert args.hybrid_layer_pattern.count("*") == 1 and len(args.hybrid_layer_pattern) == 4
    assert args.mamba_num_heads_resolved == 12  # 2 * 24 / 4
    from megatron.varlen_training.hybrid_model import HYBRID

    model = hybrid_run_config(args).model
    hybrid = model.hybrid
    assert len(HYBRID.attention_layers(model)) / len(hybrid.hybrid_layer_pattern) == 0.25
    assert describe_hybrid_model(hybrid).startswith(
        f"> hybrid layer pattern {args.hybrid_layer_pattern}: 3 Mamba, 1 attention, 0 MLP")


def test_gpt_cli_has_no_hybrid_flags():
    gpt = {opt for action in build_parser().flag_actions for opt in action.option_strings}
    hybrid = {opt for action in build_hybrid_parser().flag_actions for opt in action.option_strings}
    added = hybrid - gpt
    assert gpt < hybrid and "--hybrid-override-pattern" in added and "--mamba-state-dim" in added
    assert all(flag.startswith(("--hybrid-", "--mamba-", "--is-hybrid-", "--disable-mamba-"))
               for flag in added), added


def test_is_hybrid_model_is_accepted_and_changes_nothing():
    """Megatron-LM's scripts pass --is-hybrid-model to pretrain_mamba.py (core_v0.16.1: it
    marks the hybrid model); here every pretrain_mamba.py run is one (test_hybrid_init.py)."""
    argv = BASE + ["--hybrid-override-pattern", "M*-"]
    marked = hybrid_run_config(parse_hybrid_args(argv + ["--is-hybrid-model"], world_size=1))
    assert marked == hybrid_run_config(parse_hybrid_args(argv, world_size=1))


def test_entry_point_prints_one_line_and_exits_2(capsys):
    # pretrain_mamba.py's main() starts with this call (in-process: no interpreter start-up).
    with pytest.raises(SystemExit) as info:
        parse_hybrid_args_or_exit(BASE + ["--hybrid-override-pattern", "M?-"])
    assert info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("pretrain_mamba.py: error:"), lines


def test_scheduler_weighs_attention_by_its_layer_fraction():
    from megatron.varlen_training.arguments import parse_args
    from megatron.varlen_training.data import build_packing_config
    from megatron.varlen_training.hybrid_model import HYBRID
    from megatron.varlen_training.model_family import GPT

    def cost(args, family):
        run = hybrid_run_config(args) if family is HYBRID else run_config(args)
        return build_packing_config(run, 0, family.attention_layers(run.model)).cost

    packed = ["--sequence-packing", "--micro-batch-size", "1"]
    hybrid = parse_hybrid_args(BASE + packed + ["--num-layers", "4",
                                                "--hybrid-override-pattern", "M*MM"], world_size=1)
    mamba_only = parse_hybrid_args(BASE + packed + ["--hybrid-override-pattern", "MMM"],
                                   world_size=1)
    gpt = parse_args(BASE[:6] + BASE[12:] + packed, world_size=1)
    assert cost(hybrid, HYBRID).a == 0.25
    assert cost(mamba_only, HYBRID).a == 0.0
    assert cost(gpt, GPT).a == 1.0
    assert cost(hybrid, HYBRID).b == cost(gpt, GPT).b


@pytest.mark.parametrize("flag", ["--hf-checkpoint", "--save-hf"])
def test_hugging_face_flags_are_refused(flag, tmp_path):
    message = _error(["--hybrid-override-pattern", "M*-", flag, str(tmp_path)])
    assert message.startswith(f"{flag}: hybrid Mamba models have no Hugging Face") and \
        "pretrain_gpt.py" in message

    from megatron.varlen_training.hybrid_model import HYBRID
    from megatron.varlen_training.model_family import GPT

    assert HYBRID.hf is None and GPT.hf is not None  # the adapter the flags stand for



@pytest.mark.parametrize("spec", [
    ["megatron.core.models.mamba.mamba_layer_specs", "mamba_stack_spec"],  # core 0.16.1
    ["megatron.core.models.hybrid.hybrid_layer_specs", "hybrid_stack_spec"],  # main's rename
])
def test_megatron_cores_stock_stack_spec_is_the_default(spec):
    """Megatron-LM's mamba recipe names megatron-core's stock hybrid stack: the same run as
    without --spec; any other spec is one line."""
    pattern = ["--hybrid-override-pattern", "M*-"]
    assert vars(parse_hybrid_args(BASE + pattern + ["--spec", *spec])) == \
        vars(parse_hybrid_args(BASE + pattern))
    assert "drop the flag" in _error(pattern + ["--spec", "my.module", "my_stack_spec"])


NO_NUM_LAYERS = BASE[2:]  # BASE without --num-layers 3


@pytest.mark.parametrize("pattern, pp, first, last", [
    ("M*-M", 1, None, None),      # --num-layers omitted: the pattern's 4 layers
    ("M*|-M", 2, None, None),     # | at the even split: no uneven flag
    ("M|*-M", 2, 1, 3),
    ("M|*-|M-", 3, 1, None),      # first 1, middle 2, last 2: only the first is uneven
    ("M*|-|M", 3, 2, None),       # first 2, middle 1, last 1
    ("M|*-|M-*", 3, 1, 3),        # first 1, middle 2, last 3
])
def test_pattern_gives_the_layer_count_and_the_stages(pattern, pp, first, last):
    """Megatron-LM main: --num-layers from the pattern, | between pipeline stages; here the
    stages become megatron-core 0.16.1's first/last stage sizes (its hybrid stack's split)."""
    pp_flags = ["--pipeline-model-parallel-size", str(pp)] if pp > 1 else []
    args = parse_hybrid_args(NO_NUM_LAYERS + ["--hybrid-layer-pattern", pattern] + pp_flags,
                             world_size=pp)
    assert args.num_layers == len(pattern.replace("|", ""))
    assert args.hybrid_layer_pattern == pattern.replace("|", "")
    assert (args.decoder_first_pipeline_num_layers, args.decoder_last_pipeline_num_layers) \
        == (first, last)
    from megatron.varlen_training.pipeline_arguments import pipeline_split_of

    assert pipeline_split_of(args).stage_layers() == [len(s) for s in pattern.split("|")]


@pytest.mark.parametrize("extra, world, needle", [
    (["--hybrid-layer-pattern", "M|*-|M"], 2, "has 3 pipeline segments for "
                                              "--pipeline-model-parallel-size 2"),
    (["--hybrid-layer-pattern", "M*-M|"], 2, "leaves a pipeline stage without layers"),
    (["--hybrid-layer-pattern", "M|*-M-|M*|-"], 4, "middle stages of one size"),
    (["--hybrid-layer-pattern", "M|*-M", "--decoder-first-pipeline-num-layers", "1"], 2,
     "drop --decoder-first-pipeline-num-layers"),
    (["--hybrid-layer-pattern", "M|*-M", "--num-layers", "3"], 2,
     "has 4 layers but --num-layers is 3"),
    (["--hybrid-attention-ratio", "0.5"], 1, "--num-layers is required"),
])
def test_pattern_stages_megatron_core_cannot_place_are_one_line_errors(extra, world, needle):
    pp = ["--pipeline-model-parallel-size", str(world)] if world > 1 else []
    with pytest.raises(ArgumentValidationError) as info:
        parse_hybrid_args(NO_NUM_LAYERS + extra + pp, world_size=world)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_checkpoints_record_the_layers_not_the_stage_separators(tmp_path):
    """The | split is recorded as the first/last stage sizes (like those flags), the pattern
    without it: moving a | resumes as a split change does, not as another model."""
    from megatron.varlen_training.resume.consistency import check_run_args
    from megatron.varlen_training.resume.run_args_record import save_run_args

    def run(pattern: str, flag: str = "--hybrid-layer-pattern"):
        argv = NO_NUM_LAYERS + [flag, pattern, "--pipeline-model-parallel-size", "2"]
        return hybrid_run_config(parse_hybrid_args(argv, world_size=2))

    for flag in ("--hybrid-layer-pattern", "--hybrid-override-pattern"):  # the recorded key's
        saved = run("M|*-M", flag)
        assert saved.model.hybrid.hybrid_override_pattern == "M*-M"
        save_run_args(str(tmp_path), saved)
        assert check_run_args(str(tmp_path), run("M*|-M"), check_data=False) is None

"""The census: every flag of Megatron-LM's training parser has an answer here.

tests/unit_tests/data/megatron_lm_flags.txt lists Megatron-LM's option strings, read off its
parser by tools/megatron_lm_flags.py. Each one is known to pretrain_gpt.py's parser (honoured,
accepted as a proven no-op, a deprecated alias, or refused in one line with Megatron-LM's
default accepted), or to pretrain_mamba.py's for the hybrid ones; or it belongs to a workload
this fork does not run (OUT_OF_SCOPE below, answered by one line naming the workload), or
another branch is registering it (BEING_IMPLEMENTED, empty once merged). Parse-only: cheap.
"""

import dataclasses
import json
from pathlib import Path

import pytest

from megatron.varlen_training import megatron_lm_census_flags as census
from megatron.varlen_training import out_of_scope_flags
from megatron.varlen_training.arguments import ArgumentValidationError, build_parser, parse_args
from megatron.varlen_training.config.from_flags import run_config
from megatron.varlen_training.hybrid_arguments import build_hybrid_parser, parse_hybrid_args
from tests.harness.training_runs import TINY_GPT_ARGS

REPO = Path(__file__).resolve().parents[3]
FLAGS_FILE = REPO / "tests" / "unit_tests" / "data" / "megatron_lm_flags.txt"
SWITCHES_FILE = FLAGS_FILE.with_name("megatron_lm_switches.txt")  # those taking no value
DEFAULTS_FILE = REPO / "megatron" / "wrap" / "config" / "megatron_lm_defaults.json"
BASE = TINY_GPT_ARGS + ["--train-iters", "3"]
MAMBA_BASE = BASE + ["--num-layers", "3", "--hybrid-layer-pattern", "M*-", "--mamba-head-dim",
                     "8", "--mamba-num-groups", "2", "--mamba-state-dim", "8"]

# Megatron-LM's workloads this fork does not run, one reason each: their flags are not
# registered; given, they stop the run in one line naming the workload (out_of_scope_flags.py).
OUT_OF_SCOPE = {
    "inference / dynamic-batching / text-generation-server":
        "serving and generation: this fork trains",
    "RL / GRPO": "reinforcement learning needs the inference engine and rollouts",
    "vision (ViT / DINO / Swin)": "image models and datasets",
    "BERT / T5 / biencoder / retriever / ICT": "encoder and retrieval models",
    "logits-distillation": "teacher logits are neither saved nor loaded here",
    "workload-inspector": "NVIDIA's on-demand profiling server",
    "kitchen (NVIDIA's quantization extension)": "a closed extension of Transformer Engine",
    "fault-injector": "a resilience test tool of NVIDIA's clusters",
    "Multi-Storage Client (MSC)": "object storage; the data and checkpoints here are files "
                                  "(--disable-msc is accepted)",
}
# Registered by other branches in parallel (the lead empties this set once they are merged):
# validation / exit / init (valflags), the VPP group size (pplayout), MLA and YaRN (mla), the
# --async-* / --ckpt-* checkpoint flags (left to the checkpoint work).
BEING_IMPLEMENTED: frozenset[str] = frozenset()


def _names(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line and not line.startswith("#")]


def _options(parser) -> set[str]:
    return {option for action in parser.flag_actions for option in action.option_strings}


MEGATRON_LM = _names(FLAGS_FILE)
MEGATRON_LM_SWITCHES = set(_names(SWITCHES_FILE))
GPT_PARSER = build_parser()
GPT = _options(GPT_PARSER)
HYBRID = _options(build_hybrid_parser())
OWNED = {flag: out_of_scope_flags.family_of(flag) for flag in MEGATRON_LM}


def test_the_flag_list_is_megatron_lms():
    assert len(MEGATRON_LM) > 800 and len(set(MEGATRON_LM)) == len(MEGATRON_LM)
    assert {"--num-layers", "--micro-batch-size", "--grpo-group-size"} <= set(MEGATRON_LM)


def test_every_megatron_lm_flag_has_an_answer():
    unanswered = [flag for flag in MEGATRON_LM if flag not in GPT | HYBRID
                  and OWNED[flag] is None and flag not in BEING_IMPLEMENTED]
    assert unanswered == [], f"{len(unanswered)} Megatron-LM flags unknown here: {unanswered}"


def test_a_known_megatron_lm_flag_takes_a_value_where_megatron_lm_does():
    """A Megatron-LM command line parses here: its switches are switches (or take an optional
    value), its other flags take values."""
    assert MEGATRON_LM_SWITCHES < set(MEGATRON_LM) and "--bf16" in MEGATRON_LM_SWITCHES
    wrong = []
    for action in build_hybrid_parser().flag_actions:
        for option in set(action.option_strings) & set(MEGATRON_LM) - {"--help"}:
            switch_there = option in MEGATRON_LM_SWITCHES
            parses = action.nargs in (0, "?") if switch_there else action.nargs != 0
            if not parses:
                wrong.append((option, action.nargs, "switch" if switch_there else "value"))
    assert wrong == [], wrong


def test_the_being_implemented_set_is_still_unregistered():
    assert BEING_IMPLEMENTED <= set(MEGATRON_LM)
    registered = sorted(BEING_IMPLEMENTED & (GPT | HYBRID))
    assert registered == [], f"registered now: drop them from BEING_IMPLEMENTED: {registered}"


def test_out_of_scope_families_are_the_listed_ones_and_disjoint_from_the_parsers():
    families = out_of_scope_flags.OUT_OF_SCOPE_FAMILIES
    assert sorted(family.what for family in families) == sorted(OUT_OF_SCOPE)
    for family in families:  # no dead family, and none claims a flag answered otherwise
        assert any(owner is family for owner in OWNED.values()), family.what
    assert sorted(flag for flag, owner in OWNED.items() if owner and flag in GPT | HYBRID) == []


def _error(parse, argv) -> str:
    with pytest.raises(ArgumentValidationError) as err:
        parse(argv)
    message = str(err.value)
    assert "\n" not in message, message
    return message


def test_an_out_of_scope_flag_is_one_line_naming_its_workload():
    for flag, family in OWNED.items():
        if family is None:
            continue
        message = _error(GPT_PARSER.parse_args, BASE + [f"{flag}=1"])
        assert message.startswith(f"{flag} is a Megatron-LM {family.what} flag: not in this "
                                  f"fork"), \
            message
    # An unknown flag before it keeps argparse's message (it names every unknown token).
    assert _error(GPT_PARSER.parse_args, BASE + ["--no-such-flag", "--grpo-group-size", "2"]) \
        == "unrecognized arguments: --no-such-flag --grpo-group-size 2"


def test_a_hybrid_flag_given_to_pretrain_gpt_points_at_pretrain_mamba():
    hybrid_only = sorted(HYBRID - GPT)
    assert "--mamba-state-dim" in hybrid_only
    for flag in hybrid_only:
        assert out_of_scope_flags.HYBRID_FAMILY.owns(flag), flag
        argv = BASE + [flag] if flag in ("--is-hybrid-model", "--disable-mamba-mem-eff-path") \
            else BASE + [flag, "8"]
        assert _error(GPT_PARSER.parse_args, argv) == (
            f"{flag} is a Megatron-LM hybrid-model flag: run pretrain_mamba.py, whose parser "
            f"takes it")


def _require(condition, message):
    if not condition:
        raise ArgumentValidationError(message)


def test_refusals_run_in_validation():
    assert "--moe-enable-deepep is not supported: DeepEP" in _error(
        lambda argv: parse_args(argv, world_size=1), BASE + ["--moe-enable-deepep"])
    assert _error(lambda argv: parse_args(argv, world_size=1),
                  BASE + ["--cpu-offloading-num-layers", "2"]).startswith(
        "--cpu-offloading-num-layers 2 is not supported: activation offloading")
    parse_args(BASE + ["--cpu-offloading-num-layers", "0", "--config-logger-dir", ""],
               world_size=1)


def test_census_flags_own_their_dests():
    """No census flag writes another flag's value (an accepted flag aliasing a real dest would
    change the run); the one intended alias is --disable-align-grad-reduce."""
    census_options = {name for row in (*census.REFUSED, *census.UNREAD, *census.ACCEPTED)
                      for name in row.names}
    dests = {}
    for action in GPT_PARSER.flag_actions:
        dests.setdefault(action.dest, set()).update(action.option_strings)
    shared = {dest: sorted(options) for dest, options in dests.items()
              if options & census_options and not options <= census_options}
    assert shared == {}, shared
    assert dests["align_grad_reduce"] == {"--no-align-grad-reduce", "--disable-align-grad-reduce"}


def test_record_shapes_with_the_torch_profiler_only(tmp_path):
    profile = ["--profile", "--profile-step-start", "1", "--profile-step-end", "2"]
    parse_args(BASE + ["--record-shapes"], world_size=1)  # without --profile: nothing to record
    parse_args(BASE + profile + ["--use-pytorch-profiler", "--tensorboard-dir", str(tmp_path),
                                 "--record-shapes"], world_size=1)
    # nsys's --profile needs CUDA (refused before on CPU): the census check on its own
    nsys = GPT_PARSER.parse_args(BASE + profile + ["--record-shapes"])
    with pytest.raises(ArgumentValidationError, match="^--record-shapes with nsys's --profile"):
        census.validate_census_flags(nsys, _require)


def test_disable_align_grad_reduce_is_no_align_grad_reduce():
    assert GPT_PARSER.parse_args(BASE + ["--disable-align-grad-reduce"]).align_grad_reduce is False
    assert GPT_PARSER.parse_args(BASE + ["--no-align-grad-reduce"]).align_grad_reduce is False
    assert GPT_PARSER.parse_args(BASE).align_grad_reduce is True


def test_refused_mamba_flags_of_pretrain_mamba():
    def parse(argv):
        return parse_hybrid_args(argv, world_size=1)
    assert _error(parse, MAMBA_BASE + ["--disable-mamba-mem-eff-path"]).startswith(
        "--disable-mamba-mem-eff-path is not supported: the Mamba training path here")
    assert _error(parse, MAMBA_BASE + ["--mamba-training-ssm-states-dtype", "fp32"]).startswith(
        "--mamba-training-ssm-states-dtype fp32 is not supported")
    parse(MAMBA_BASE)


def test_main_only_flags_say_so():
    """A flag core_r0.16 lacks (its dest is not among Megatron-LM core_v0.8.0 / core_v0.16.1's
    defaults, megatron/wrap/config/megatron_lm_defaults.json) says it is Megatron-LM main's."""
    released = set(json.loads(DEFAULTS_FILE.read_text()))
    for action in GPT_PARSER.flag_actions:
        if action.option_strings[0] in census.IN_CORE_R016 or \
                census.MAIN_ONLY_NOTE.strip() in (action.help or ""):
            main_only = action.dest not in released
            assert (census.MAIN_ONLY_NOTE.strip() in action.help) == main_only, \
                action.option_strings


def test_disable_jit_fuser_runs_megatron_cores_jit_functions_eagerly(monkeypatch):
    """megatron-core's bias-GELU is torch.compile-wrapped at import (its jit_fuser); with the
    flag applied, calling it reaches no dynamo frame (counted by torch itself) and gives the
    plain formula's numbers; the functions decorated later get megatron-core's no-op decorator."""
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    from megatron.core import jit
    from megatron.core.fusions.fused_bias_gelu import bias_gelu
    from megatron.varlen_training.process_settings import apply_before_join

    monkeypatch.setattr(torch._dynamo.config, "disable", False)  # restored after the test
    monkeypatch.setattr(jit, "jit_fuser", jit.jit_fuser)
    assert hasattr(bias_gelu, "_torchdynamo_orig_callable")  # compiled, as megatron-core made it
    assert not run_config(parse_args(BASE, world_size=1)).runtime.disable_jit_fuser
    runtime = run_config(parse_args(BASE + ["--disable-jit-fuser"], world_size=1)).runtime
    apply_before_join(runtime)
    assert jit.jit_fuser is jit.noop_decorator
    counters.clear()
    bias, y = torch.zeros(8, dtype=torch.float64), torch.linspace(-3, 3, 8, dtype=torch.float64)
    tanh_gelu = 0.5 * y * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (y + 0.044715 * y ** 3)))
    torch.testing.assert_close(bias_gelu(bias, y), tanh_gelu, rtol=1e-6, atol=1e-7)
    assert counters["frames"]["total"] == 0, dict(counters["frames"])


def _vocabulary_rows(extra: list[str]) -> int:
    """The model's vocabulary rows once the tokenizer (here: --vocab-size's) is known."""
    run = run_config(parse_args(BASE + extra, world_size=1))
    return run.with_vocabulary(run.model.vocab_size).model.padded_vocab_size


def test_padded_vocab_size_is_the_models_vocabulary_exactly():
    """Megatron-LM: --padded-vocab-size N builds N rows, no padding rule; without it the
    vocabulary is padded up to a multiple of --make-vocab-size-divisible-by x TP (the base's
    32 x 1: 128 stays 128, 150 becomes ceil(150 / 32) x 32 = 160)."""
    assert _vocabulary_rows([]) == 128
    assert _vocabulary_rows(["--vocab-size", "150"]) == 160
    assert _vocabulary_rows(["--vocab-size", "150", "--padded-vocab-size", "150"]) == 150
    assert _vocabulary_rows(["--padded-vocab-size", "200"]) == 200


@pytest.mark.parametrize("extra, world, needle", [
    (["--padded-vocab-size", "100"], 1, "--padded-vocab-size 100 is smaller than --vocab-size 128"),
    (["--padded-vocab-size", "201", "--tensor-model-parallel-size", "2"], 2,
     "--padded-vocab-size 201 is not divisible by --tensor-model-parallel-size 2"),
])
def test_an_impossible_padded_vocab_size_is_one_line(extra, world, needle):
    assert needle in _error(lambda argv: parse_args(argv, world_size=world), BASE + extra)


def test_a_tokenizer_larger_than_the_padded_vocab_size_is_one_line():
    run = run_config(parse_args(BASE + ["--padded-vocab-size", "128"], world_size=1))
    run = dataclasses.replace(run, model=dataclasses.replace(run.model, vocab_size=None))
    with pytest.raises(ArgumentValidationError, match="^--padded-vocab-size 128 is smaller than "
                                                      "the tokenizer's vocabulary \\(300\\)"):
        run.with_vocabulary(300)


@pytest.mark.parametrize("spelling", [["--lazy-mpu-init"], ["--lazy-mpu-init", "True"]])
def test_lazy_mpu_init_in_both_megatron_lm_spellings_is_one_line(spelling):
    """Main's bare switch and core_v0.16.1's value both reach the refusal (not argparse's
    'expected one argument')."""
    assert _error(lambda argv: parse_args(argv, world_size=1), BASE + spelling).startswith(
        "--lazy-mpu-init is not supported: model-parallel state")

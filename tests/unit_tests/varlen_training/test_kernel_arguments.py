"""Megatron-LM's kernel, fusion and implementation flags (kernel_arguments.py) on a Megatron-LM
command line: each honoured one does what Megatron-LM's does, each no-op changes neither the
built config nor the losses, each deprecated alias equals its replacement, each refused one is
one line (exit code 2 from the entry point).

References: the facts of Megatron-LM core_v0.16.1 written down here (its flags' messages and
derivations; main where a flag says so), the TransformerConfig built WITHOUT the flag, and tiny
training runs without it. test_transformer_config_reference.py compares the fields these flags
set with a reference built from Megatron-LM's core_transformer_config_from_args.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from megatron.varlen_training import kernel_arguments
from megatron.varlen_training.config.from_flags import parse_hybrid_run_config, parse_run_config
from megatron.varlen_training.flag_errors import ArgumentValidationError
from megatron.varlen_training.model import build_transformer_config
from tests.harness.training_runs import TINY_GPT_ARGS

REPO = Path(__file__).resolve().parents[3]
BASE = TINY_GPT_ARGS + ["--train-iters", "3"]
ROPE = ["--position-embedding-type", "rope"]
SWIGLU = ["--swiglu", "--ffn-hidden-size", "64"]

# flag and an asking value -> the words of the one-line refusal (Megatron-LM's own for the
# flags it removed: "... is no longer valid, use X instead").
REFUSALS = {
    ("--use-legacy-models",): "legacy",
    ("--fp8-recipe", "mxfp8"): "--fp8-format",
    ("--fp8-margin", "2"): "--fp8-format",
    ("--fp8-interval", "4"): "--fp8-format",
    ("--fp8-amax-history-len", "1024"): "--fp8-format",
    ("--fp8-amax-compute-algo", "max"): "--fp8-format",
    ("--fp8-param-gather",): "--fp8-format",
    ("--no-fp8-wgrad",): "--fp8-format",
    ("--disable-fp8-wgrad",): "--fp8-format",
    ("--tp-comm-overlap",): "userbuffers",
    ("--tp-comm-overlap-cfg", "ub.yaml"): "--tp-comm-overlap",
    ("--cuda-graph-impl", "local"): "CUDA graphs",
    ("--cuda-graph-impl", "transformer_engine"): "CUDA graphs",
    ("--cuda-graph-scope", "attn", "mlp"): "CUDA graphs",
    ("--enable-cuda-graph",): "--cuda-graph-impl=local",
    ("--external-cuda-graph",): "--cuda-graph-impl=transformer_engine",
    ("--te-rng-tracker",): "RNG tracker",
    ("--batch-size", "8"): "use --micro-batch-size instead",
    ("--warmup", "100"): "--lr-warmup-",
    ("--model-parallel-size", "2"): "use --tensor-model-parallel-size instead",
    ("--checkpoint-activations",): "use --recompute-activations",
    ("--rope-type", "yarn"): "rope only",
    ("--transformer-impl", "inference_optimized"): "transformer_engine",
    ("--no-position-embedding",): "use --position-embedding-type",
}
# Megatron-LM's defaults of refused flags: given, they change nothing and are accepted.
NEUTRAL = [["--fp8-recipe", "delayed"], ["--fp8-margin", "0"], ["--fp8-interval", "1"],
           ["--fp8-amax-history-len", "1"], ["--fp8-amax-compute-algo", "most_recent"],
           ["--cuda-graph-impl", "none"], ["--rope-type", "rope"],
           ["--transformer-impl", "transformer_engine"]]
# Kernels that are Transformer Engine's: refused in one line where it is not installed.
TE_KERNELS = {("--moe-router-fusion",): "--moe-router-fusion",
              ("--moe-permute-fusion",): "--moe-permute-fusion",
              ("--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te"):
                  "--cross-entropy-fusion-impl te"}


def _run(extra: list[str], base: list[str] = BASE):
    return parse_run_config(base + extra, world_size=1)


def _config_fields(extra: list[str], base: list[str] = BASE) -> dict:
    """The built TransformerConfig's values but its callables (init methods are new closures
    per build)."""
    config = build_transformer_config(_run(extra, base))
    return {name: value for name, value in vars(config).items() if not callable(value)}


@pytest.mark.parametrize("argv", sorted(REFUSALS), ids=" ".join)
def test_refused_flags_are_one_line(argv):
    with pytest.raises(ArgumentValidationError) as err:
        _run(list(argv))
    message = str(err.value)
    assert argv[0] in message and REFUSALS[argv] in message and "\n" not in message, message


def test_every_refused_flag_has_a_case():
    """A flag added to the refused table (or an alias refused with it) gets a row above."""
    refused = {*(row.flag for row in kernel_arguments.REFUSED_FLAGS),
               *kernel_arguments.CUDA_GRAPH_ALIASES}
    assert refused <= {argv[0] for argv in REFUSALS}


@pytest.mark.parametrize("argv", NEUTRAL, ids=" ".join)
def test_megatron_lms_neutral_values_are_accepted(argv):
    assert _config_fields(argv) == _config_fields([])


def test_refusal_leaves_the_entry_point_in_one_line_with_exit_code_2():
    """One representative through pretrain_gpt.py; --fp8 is no Megatron-LM flag at all (its
    parser, allow_abbrev=False, says "unrecognized arguments" too)."""
    env = {"WORLD_SIZE": "1", "PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "ignore"}
    for extra, needle in ((["--fp8-param-gather"], "--fp8-param-gather is not supported"),
                          (["--fp8"], "unrecognized arguments: --fp8")):
        proc = subprocess.run([sys.executable, str(REPO / "pretrain_gpt.py"), *BASE, *extra],
                              capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], proc.stderr


@pytest.mark.parametrize("argv", sorted(TE_KERNELS), ids=" ".join)
def test_transformer_engine_kernels_need_it(monkeypatch, argv):
    monkeypatch.setattr(kernel_arguments, "transformer_engine_installed", lambda: False)
    with pytest.raises(ArgumentValidationError) as err:
        _run(list(argv))
    assert TE_KERNELS[argv] in str(err.value) and "Transformer Engine" in str(err.value)


def test_te_cross_entropy_choice_alone_changes_nothing(monkeypatch):
    """Megatron-LM reads --cross-entropy-fusion-impl only under --cross-entropy-loss-fusion."""
    monkeypatch.setattr(kernel_arguments, "transformer_engine_installed", lambda: False)
    assert _config_fields(["--cross-entropy-fusion-impl", "te"]) == {
        **_config_fields([]), "cross_entropy_fusion_impl": "te"}


def test_moe_fusions_reach_the_config_where_transformer_engine_is(monkeypatch):
    """With Transformer Engine, --moe-router-fusion / --moe-permute-fusion set their
    TransformerConfig fields, which megatron-core's router and dispatcher read (Megatron-LM
    copies them by name). megatron-core checks TE's permute kernels at config build: stand-ins."""
    from megatron.core.transformer.moe import moe_utils

    monkeypatch.setattr(kernel_arguments, "transformer_engine_installed", lambda: True)
    for name in ("fused_permute", "fused_permute_with_probs", "fused_sort_chunks_by_index",
                 "fused_sort_chunks_by_index_with_probs", "fused_unpermute"):
        monkeypatch.setattr(moe_utils, name, object(), raising=False)
    moe = ["--num-experts", "4", "--disable-bias-linear", "--moe-token-dispatcher-type",
           "alltoall"]
    fused = _config_fields(moe + ["--moe-router-fusion", "--moe-permute-fusion"])
    plain = _config_fields(moe)
    assert (fused["moe_router_fusion"], fused["moe_permute_fusion"]) == (True, True)
    assert {**fused, "moe_router_fusion": False, "moe_permute_fusion": False} == plain


def test_no_bias_dropout_fusion_turns_the_probed_fusion_off(monkeypatch):
    """Where the platform would fuse bias-dropout-add (CUDA, the probe passed), the flag turns
    it off, as Megatron-LM's --no-bias-dropout-fusion sets bias_dropout_fusion False."""
    from megatron.varlen_training import model

    monkeypatch.setattr(model, "use_bias_dropout_add_fusion", lambda dropout, bias: True)
    assert _config_fields([])["bias_dropout_fusion"] is True
    assert _config_fields(["--no-bias-dropout-fusion"])["bias_dropout_fusion"] is False


def test_bf16_reduced_precision_matmul_switch_is_set_as_megatron_lm():
    """megatron-core's TransformerConfig turns torch's CUDA switch off for bf16 with the flag
    (Megatron-LM's only use of it); without --bf16 it stays."""
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_bf16_reduced_precision_reduction
    try:
        matmul.allow_bf16_reduced_precision_reduction = True
        _config_fields(["--disable-bf16-reduced-precision-matmul"])
        assert matmul.allow_bf16_reduced_precision_reduction is True
        _config_fields(["--bf16"])
        assert matmul.allow_bf16_reduced_precision_reduction is True
        fields = _config_fields(["--bf16", "--disable-bf16-reduced-precision-matmul"])
        assert fields["disable_bf16_reduced_precision_matmul"] is True
        assert matmul.allow_bf16_reduced_precision_reduction is False
    finally:
        matmul.allow_bf16_reduced_precision_reduction = before


# Flags that leave the built TransformerConfig as it is without them (the field stays what
# this fork builds; Megatron-LM's own megatron-core models ignore the last five).
NO_OP_FLAGS = [["--no-masked-softmax-fusion"], ["--no-bias-gelu-fusion"],
               ["--no-bias-swiglu-fusion"], ["--no-gradient-accumulation-fusion"],
               ["--no-persist-layer-norm"], ["--no-bias-dropout-fusion"], ["--no-rope-fusion"],
               ["--moe-grouped-gemm"], ["--use-mcore-models"], ["--use-flash-attn"],
               ["--openai-gelu"], ["--onnx-safe", "False"]]


@pytest.mark.parametrize("argv", NO_OP_FLAGS, ids=" ".join)
def test_no_op_flags_build_the_same_config(argv):
    for base in (BASE, BASE + SWIGLU + ROPE):
        assert _config_fields(argv, base) == _config_fields([], base)


def test_use_mcore_models_changes_nothing_in_the_run():
    assert _run(["--use-mcore-models"]).model == _run([]).model


def _printed(capfd) -> str:
    captured = capfd.readouterr()
    return captured.out + captured.err


def test_rotary_alias_is_position_embedding_type_rope():
    """Megatron-LM's validate_args: --use-rotary-position-embeddings sets rope (silently)."""
    alias = _run(["--use-rotary-position-embeddings"])
    assert alias.model == _run(ROPE).model
    assert _config_fields(["--use-rotary-position-embeddings"]) == _config_fields(ROPE)


def test_no_position_embedding_beside_rope_changes_nothing():
    """Megatron-LM accepts it only beside rope (its RuntimeError otherwise: refused above),
    where nothing reads it."""
    assert _run(ROPE + ["--no-position-embedding"]).model == _run(ROPE).model


def test_transformer_impl_local_builds_the_same_layers():
    """The only field that differs is transformer_impl itself (Megatron-LM's value)."""
    local = _config_fields(["--transformer-impl", "local"])
    assert local["transformer_impl"] == "local"
    assert {**local, "transformer_impl": "transformer_engine"} == _config_fields([])


HYBRID = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
          "--seq-length", "32", "--lr", "1e-3", "--train-iters", "1", "--mock-data",
          "--vocab-size", "128", "--mamba-state-dim", "16", "--mamba-head-dim", "16",
          "--mamba-num-groups", "2"]


def test_hybrid_override_pattern_is_main_s_deprecated_name(capfd):
    """Megatron-LM main forwards --hybrid-override-pattern to --hybrid-layer-pattern with a
    warning and refuses both together; the run is the same either way."""
    new = parse_hybrid_run_config(HYBRID + ["--hybrid-layer-pattern", "M*M-"], world_size=1)
    assert "deprecated" not in _printed(capfd)
    old = parse_hybrid_run_config(HYBRID + ["--hybrid-override-pattern", "M*M-"], world_size=1)
    assert ("--hybrid-override-pattern is deprecated. Use --hybrid-layer-pattern instead."
            in _printed(capfd))
    assert new.model == old.model and new.model.hybrid.hybrid_layer_pattern == "M*M-"
    with pytest.raises(ArgumentValidationError, match="cannot both be specified"):
        parse_hybrid_run_config(HYBRID + ["--hybrid-layer-pattern", "M*M-",
                                          "--hybrid-override-pattern", "MM*-"], world_size=1)
    with pytest.raises(ArgumentValidationError, match=r"--hybrid-layer-pattern 'M\*M' has 3"):
        parse_hybrid_run_config(HYBRID + ["--hybrid-layer-pattern", "M*M"], world_size=1)


# --- the same losses --------------------------------------------------------------------------

NO_OP_RUN = [flag for argv in NO_OP_FLAGS for flag in argv if argv != ["--moe-grouped-gemm"]]
MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--disable-bias-linear",
       "--moe-token-dispatcher-type", "alltoall"]


def _train_each(argvs: list[list[str]]) -> list[tuple[list[dict], int]]:
    """Trains each command line in turn on this rank (one process start for all): its history
    and how many times megatron-core's fused cross entropy ran."""
    from megatron.core.models.common.language_module import language_module
    from tests.harness.training_runs import train_on_this_rank

    fused = language_module.fused_vocab_parallel_cross_entropy
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return fused(*args, **kwargs)

    language_module.fused_vocab_parallel_cross_entropy = counted
    runs = []
    for argv in argvs:
        calls.clear()
        runs.append((train_on_this_rank(argv)["history"], len(calls)))
    return runs


def _losses(history: list[dict], key: str = "lm_loss") -> list[float]:
    return [step[key] for step in history]


def test_no_op_flags_and_fused_cross_entropy_train_the_same_losses():
    """Every accepted no-op together trains bit-identical losses and gradient norms (a dense
    SwiGLU/RoPE model and, for --moe-grouped-gemm, an MoE one). --cross-entropy-loss-fusion runs
    megatron-core's fused cross entropy: the same first loss, then the same within float32
    rounding of its gradients."""
    from tests.harness.multirank import run_distributed

    dense = BASE + SWIGLU + ROPE
    runs = [dense, dense + NO_OP_RUN + ["--transformer-impl", "local"], BASE + MOE,
            BASE + MOE + ["--moe-grouped-gemm"], BASE, BASE + ["--cross-entropy-loss-fusion"]]
    results = run_distributed(_train_each, 1, args=(runs,), timeout_s=400)[0]
    plain, no_ops, moe, grouped, unfused, fused = (history for history, _ in results)
    assert [calls > 0 for _, calls in results] == [False] * 5 + [True]
    for key in ("lm_loss", "grad_norm"):
        assert _losses(no_ops, key) == _losses(plain, key)
        assert _losses(grouped, key) == _losses(moe, key)
    assert len(set(_losses(plain))) == 3  # it trains: the comparison is not of constants
    assert _losses(fused)[0] == pytest.approx(_losses(unfused)[0], rel=1e-6)
    assert _losses(fused) == pytest.approx(_losses(unfused), rel=1e-5)


def test_checkpoints_record_the_pattern_whichever_name_gave_it(tmp_path):
    """run_args.json records the given pattern under one key: a checkpoint written with the
    old name is taken by --use-checkpoint-args and resumed with the new one (and back)."""
    from tests.unit_tests.varlen_training import test_use_checkpoint_args as ckptargs
    from megatron.varlen_training.resume.consistency import check_run_args
    from megatron.varlen_training.resume.run_args_record import save_run_args

    train = ["--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "1e-3",
             "--mock-data", "--train-iters", "4"]
    shape = HYBRID[:8]  # layers, hidden size, heads, sequence length
    mamba = HYBRID[-6:]
    old = shape + mamba + ["--vocab-size", "128", "--hybrid-override-pattern", "M*M-"]
    root = ckptargs._record(tmp_path / "old", 2, old + train, parse=parse_hybrid_run_config)
    taken = parse_hybrid_run_config(train + ckptargs.USE + ["--load", str(root)], world_size=1)
    new = parse_hybrid_run_config(shape + mamba + ["--vocab-size", "128",
                                                   "--hybrid-layer-pattern", "M*M-"] + train,
                                  world_size=1)
    assert taken.model == new.model
    save_run_args(str(tmp_path), parse_hybrid_run_config(old + train, world_size=1))
    assert check_run_args(str(tmp_path), new, check_data=False) is None


def test_mixtral_recipe_kernel_flags_build_the_same_model():
    """Megatron-LM's examples/mixtral/train_mixtral_8x7b_distributed.sh carries these (main):
    once "unrecognized arguments" here, now the same model as without them."""
    recipe = ["--use-mcore-models", "--no-masked-softmax-fusion", "--no-position-embedding",
              "--moe-grouped-gemm"]
    base = BASE + MOE + ROPE
    assert _run(recipe, base).model == _run([], base).model
    assert _config_fields(recipe, base) == _config_fields([], base)


@pytest.mark.parametrize("key, value, accepted", [
    ("transformer_impl", "local", True), ("transformer_impl", "inference_optimized", False),
    ("use_legacy_models", "true", False), ("use_flash_attn", "true", True)])
def test_megatron_wrap_views_meet_the_same_flags(tmp_path, key, value, accepted):
    """A megatron-wrap view's Megatron-LM keys reach the parser: what the command line refuses,
    a view cannot slip past (transformer_impl and use_legacy_models were once dropped as kernel
    choices whatever their value)."""
    from megatron.varlen_training.flag_values import parse_values
    from megatron.wrap.config import build_config
    from tests.unit_tests.wrap.megatron_wrap_format import write_nest

    config = build_config(write_nest(tmp_path), overrides=[f"megatron_lm.model.arch.{key}={value}"])
    values = {**config.flat, "mock_data": True, "train_iters": 2}
    if accepted:
        parse_values(values, world_size=1)
    else:
        with pytest.raises(ArgumentValidationError, match=f"--{key.replace('_', '-')}"):
            parse_values(values, world_size=1)


def test_attention_kernel_names_reach_the_config():
    """Megatron-LM's --attention-backend fused / unfused hold TE to that kernel through
    TransformerConfig.attention_backend (megatron-core sets NVTE_*_ATTN from it); the other
    choices leave TE its own pick (megatron-core's auto)."""
    from dataclasses import replace

    from megatron.core.transformer.enums import AttnBackend
    run = _run([])
    for name, expected in (("fused", AttnBackend.fused), ("unfused", AttnBackend.unfused),
                           ("te", AttnBackend.auto), ("local", AttnBackend.auto),
                           ("flash", AttnBackend.auto), ("auto", AttnBackend.auto)):
        model = replace(run.model, attention_backend=name)
        assert build_transformer_config(replace(run, model=model)).attention_backend == expected

"""``--spec MODULE FUNCTION`` against the flags a spec decides.

Megatron-LM calls a ``--spec`` function without arguments, so the spec alone decides the norms.
Naming our own default spec must therefore build what no ``--spec`` builds (it dropped
``--qk-layernorm``, ``--normalization`` and ``--attention-backend`` before); a custom spec
without QK norms refuses ``--qk-layernorm`` (the flag would do nothing); and the Hugging Face
weight mapping, written for the default spec, refuses a custom one.
"""

import pytest

from megatron.varlen.model.spec_loading import DEFAULT_SPEC, is_default_spec, load_layer_spec
from megatron.varlen_training.arguments import ArgumentValidationError, parse_args
from tests.harness.extras import needs_extra
from tests.harness.training_runs import TINY_GPT_ARGS

BASE = TINY_GPT_ARGS + ["--train-iters", "1", "--micro-batch-size", "1", "--mock-data"]
CORE_LOCAL_SPEC = ["megatron.core.models.gpt.gpt_layer_specs", "get_gpt_layer_local_spec"]


def _error(extra) -> str:
    with pytest.raises(ArgumentValidationError) as err:
        parse_args(BASE + extra, world_size=1)
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("qk_layernorm", [False, True])
def test_naming_the_default_spec_builds_the_default(normalization, qk_layernorm):
    named = load_layer_spec(list(DEFAULT_SPEC), normalization, qk_layernorm=qk_layernorm)
    assert named == load_layer_spec(None, normalization, qk_layernorm=qk_layernorm)
    norm = named.submodules.self_attention.submodules.q_layernorm
    assert (getattr(norm, "__name__", "") != "IdentityOp") == qk_layernorm


def test_default_spec_named_with_qk_layernorm_is_accepted():
    args = parse_args(BASE + ["--spec", *DEFAULT_SPEC, "--qk-layernorm"], world_size=1)
    assert is_default_spec(args.spec) and args.qk_layernorm


def test_custom_spec_without_qk_norms_refuses_qk_layernorm():
    message = _error(["--spec", *CORE_LOCAL_SPEC, "--qk-layernorm"])
    assert message.startswith("--qk-layernorm: the layer spec from --spec "
                              + " ".join(CORE_LOCAL_SPEC))
    assert "q_layernorm is IdentityOp" in message


def test_custom_spec_alone_is_accepted():
    assert parse_args(BASE + ["--spec", *CORE_LOCAL_SPEC], world_size=1).spec == CORE_LOCAL_SPEC


def test_save_hf_refuses_a_custom_spec(tmp_path):
    message = _error(["--spec", *CORE_LOCAL_SPEC, "--save-hf", str(tmp_path / "out")])
    assert message.startswith("--save-hf maps Hugging Face weights onto the default layer spec")


@needs_extra("hf")
def test_hf_checkpoint_refuses_a_custom_spec(tmp_path):
    from tests.unit_tests.varlen_training.hf.tiny_models import model_argv, save_hf_model

    source = save_hf_model("llama", tmp_path / "llama")
    with pytest.raises(ArgumentValidationError) as err:
        parse_args(model_argv(source, "--spec", *CORE_LOCAL_SPEC), world_size=1)
    assert str(err.value).startswith(
        "--hf-checkpoint maps Hugging Face weights onto the default layer spec, not --spec")

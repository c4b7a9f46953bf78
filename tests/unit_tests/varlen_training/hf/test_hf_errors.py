"""Bad Hugging Face input: each a one-line error naming the problem, at start-up.

ArgumentValidationError is what pretrain_gpt.py prints as one line with exit code 2.
"""

import json
import os
from pathlib import Path

import pytest

from megatron.varlen_training.arguments import ArgumentValidationError
from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.hf.safetensors_io import INDEX_FILE
from megatron.varlen_training.tokenizer import NullTokenizer, check_tokenizer_fits
from tests.harness.extras import needs_extra
from tests.unit_tests.varlen_training.hf.tiny_models import model_argv, save_hf_model

pytestmark = needs_extra("hf")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return Path(save_hf_model("llama", tmp_path_factory.mktemp("hf") / "llama"))


def _edited_config(tmp_path, source: Path, **changes) -> Path:
    target = tmp_path / "edited"
    target.mkdir()
    for name in os.listdir(source):
        os.symlink(source / name, target / name)
    config = json.loads((source / "config.json").read_text())
    config.update(changes)
    os.remove(target / "config.json")
    (target / "config.json").write_text(json.dumps(config))
    return target


def _error(argv, world=1) -> str:
    with pytest.raises(ArgumentValidationError) as err:
        parse_run_config(argv, world_size=world)
    message = str(err.value)
    assert "\n" not in message, message
    return message


def test_standard_attention_checkpoint_with_mla_flag(llama):
    """Only a DeepSeek-V3 checkpoint has multi-latent attention: the flag is a conflict."""
    message = _error(model_argv(llama, "--multi-latent-attention"))
    assert "--multi-latent-attention True conflicts with the --hf-checkpoint" in message


def test_directory_without_config_json(tmp_path):
    assert "has no config.json" in _error(model_argv(tmp_path))


def test_missing_shard(tmp_path, llama):
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "config.json").write_text((llama / "config.json").read_text())
    os.symlink(llama / "model.safetensors", sharded / "model-00001-of-00002.safetensors")
    weight_map = {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                  "lm_head.weight": "model-00002-of-00002.safetensors"}
    (sharded / INDEX_FILE).write_text(json.dumps({"weight_map": weight_map}))
    message = _error(model_argv(sharded))
    assert "'model-00002-of-00002.safetensors', which is missing" in message


@pytest.mark.parametrize("changes, needle", [
    ({"architectures": ["MixtralForCausalLM"]}, "unsupported architecture ['MixtralForCausalLM']"),
    ({"hidden_act": "gelu"}, "unsupported value hidden_act='gelu'"),
    ({"num_experts": 8}, "unsupported config field 'num_experts'=8"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}},
     "unsupported rope scaling type 'yarn'"),
    ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 2.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
                          "rope_theta": 5e5}}, "low_freq_factor=2.0"),
    ({"attention_bias": True}, "unsupported value attention_bias=True for LlamaForCausalLM"),
])
def test_unsupported_architecture_or_field(tmp_path, llama, changes, needle):
    assert needle in _error(model_argv(_edited_config(tmp_path, llama, **changes)))


@pytest.mark.parametrize("flag, value", [("--rotary-percent", "0.5"),
                                         ("--rotary-seq-len-interpolation-factor", "2")])
def test_partial_or_interpolated_rope_conflicts_with_the_checkpoint(llama, flag, value):
    """Megatron-LM's RoPE flags would build another model than the checkpoint's."""
    assert f"{flag} {value} conflicts with the --hf-checkpoint" in _error(
        model_argv(llama, flag, value))


def test_vocabulary_larger_than_the_flags_allow(llama):
    message = _error(model_argv(llama, "--vocab-size", "128"))
    assert "--vocab-size 128 conflicts with the --hf-checkpoint" in message
    assert "value 256" in message
    with pytest.raises(ValueError, match="the tokenizer has 300 ids but the model's vocabulary"):
        check_tokenizer_fits(NullTokenizer(300), 256, "NullTokenizer")
    # The hint names the flags of the run's type: a GPT-2 BPE run reads no --tokenizer-model.
    with pytest.raises(ValueError, match=r"use a matching tokenizer \(--tokenizer-type "
                                         r"GPT2BPETokenizer, --vocab-file, --merge-file\)$"):
        check_tokenizer_fits(NullTokenizer(300), 256, "GPT2BPETokenizer")


def test_conflicting_architecture_flag_names_both_values(llama):
    message = _error(model_argv(llama, "--num-layers", "2"))
    assert "--num-layers 2 conflicts" in message and "config.json value 4" in message
    # The same value is not a conflict; the architecture flags are optional.
    model = parse_run_config(model_argv(llama, "--num-layers", "4"), world_size=1).model
    assert (model.num_layers, model.num_query_groups, model.swiglu) == (4, 2, True)


@pytest.mark.parametrize("tp, needle", [
    ("8", "--num-attention-heads 4 is not divisible by --tensor-model-parallel-size 8"),
    ("4", "--num-query-groups 2 is not divisible by --tensor-model-parallel-size 4"),
])
def test_tp_that_does_not_divide_heads_or_kv_groups(llama, tp, needle):
    assert needle in _error(model_argv(llama, "--tensor-model-parallel-size", tp), world=int(tp))




def test_save_hf_needs_an_exportable_architecture():
    from tests.harness.training_runs import TINY_GPT_ARGS

    message = _error(TINY_GPT_ARGS + ["--train-iters", "1", "--save-hf", "/tmp/unused"])
    assert "--save-hf: export to Hugging Face needs --normalization RMSNorm" in message


def test_a_tensor_missing_from_the_weights_is_one_line_at_import(tmp_path, llama):
    """Found while the weights load (after start-up): one line through pretrain_gpt.py, exit
    code 2, not a traceback (the import is agreed across ranks: model.build_model)."""
    import subprocess
    import sys

    from safetensors.torch import load_file, save_file

    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for name in os.listdir(llama):
        if name != "model.safetensors":
            os.symlink(llama / name, damaged / name)
    tensors = load_file(str(llama / "model.safetensors"))
    del tensors["model.norm.weight"]
    save_file(tensors, str(damaged / "model.safetensors"), metadata={"format": "pt"})
    repo = Path(__file__).resolve().parents[4]
    proc = subprocess.run([sys.executable, "pretrain_gpt.py", *model_argv(damaged)], cwd=repo,
                          capture_output=True, text=True, timeout=180,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(repo),
                               "PYTHONWARNINGS": "ignore", "CUDA_VISIBLE_DEVICES": ""})
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and lines == [
        f"pretrain_gpt.py: error: Hugging Face checkpoint '{damaged}' has no tensor "
        f"'model.norm.weight'"], proc.stderr[-3000:]


def test_tiktokenizer_is_refused(llama):
    """The checkpoint's config.json vocab_size counts embedding rows; a TikTokenizer sized by
    it (and numbering its tokens after its special ids) would not index that embedding."""
    message = _error(model_argv(llama) + ["--tokenizer-type", "TikTokenizer",
                                          "--tokenizer-model", str(llama / "tok.json"),
                                          "--tiktoken-num-special-tokens", "10"])
    assert message == (
        f"--hf-checkpoint with --tokenizer-type TikTokenizer is not supported: the "
        f"checkpoint's config.json vocab_size counts its embedding rows, while TikTokenizer is "
        f"sized by --vocab-size and numbers its tokens after its --tiktoken-num-special-tokens "
        f"special ids, so its ids would not index that embedding; use --tokenizer-type "
        f"HuggingFaceTokenizer --tokenizer-model {llama}")


@pytest.mark.parametrize("flags, flag", [
    (["--softmax-type", "learnable"], "--softmax-type"),
    (["--glu-linear-offset", "1"], "--glu-linear-offset"),
    (["--activation-func-clamp-value", "7"], "--activation-func-clamp-value"),
    (["--no-rope-freq", "2"], "--no-rope-freq"),
])
def test_what_no_exported_architecture_holds_is_refused(llama, flags, flag, tmp_path):
    """An attention sink, gpt-oss's GLU offset/clamp, NoPE layers: --save-hf refuses them at
    start-up (an export would silently drop them), --hf-checkpoint takes none (a conflict)."""
    from megatron.varlen_training.config.from_flags import parse_run_config
    from tests.harness.training_runs import TINY_GPT_ARGS

    export = TINY_GPT_ARGS + ["--train-iters", "1", "--normalization", "RMSNorm", "--swiglu",
                              "--disable-bias-linear", "--position-embedding-type", "rope",
                              "--save-hf", str(tmp_path / "out"), *flags]
    with pytest.raises(ArgumentValidationError) as err:
        parse_run_config(export, world_size=1)
    assert str(err.value).startswith("--save-hf: export to Hugging Face needs " + flag)
    assert flag in _error(model_argv(llama, *flags)) and "conflicts" in _error(
        model_argv(llama, *flags))

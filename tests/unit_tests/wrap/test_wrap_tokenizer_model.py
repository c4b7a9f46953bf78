"""A facade config's ``tokenizer_model`` (tokenizer_arguments.py): in a native config it is
pretrain_gpt.py's ``--tokenizer-model``, refused in one line beside a type that would ignore it;
in a megatron-wrap config it is dropped with its reason (megatron-wrap never built Megatron-LM's
tokenizer: the script tokenizes), so such a config keeps building."""

from __future__ import annotations

import pytest

from megatron.varlen_training.flag_errors import ArgumentValidationError
from megatron.wrap.config import build_config
from megatron.wrap.config.nest_keys import ACCEPTED
from megatron.wrap.runtime import run_config_of
from tests.unit_tests.wrap.megatron_wrap_format import write_nest


def test_facade_native_config_refuses_it_in_one_line():
    config = build_config({
        "model": {"num_layers": 1, "hidden_size": 16, "num_attention_heads": 2,
                  "seq_length": 32, "vocab_size": 64},
        "training": {"micro_batch_size": 1, "global_batch_size": 2, "train_iters": 1,
                     "lr": 1e-3},
        "data": {"tokenizer_type": "NullTokenizer", "tokenizer_model": "models/tok"},
    })
    with pytest.raises(ArgumentValidationError,
                       match=r"^--tokenizer-model 'models/tok' is read by --tokenizer-type "
                             r"HuggingFaceTokenizer, the SentencePiece types and TikTokenizer "
                             r"only, but --tokenizer-type is NullTokenizer"):
        run_config_of(config, world_size=1)


def test_megatron_wrap_view_drops_its_tokenizer_model_with_the_reason(tmp_path):
    """megatron-wrap's configs name Megatron-LM's tokenizer (a SentencePiece model file) that
    megatron-wrap itself never built: the key is dropped and reported, the run builds."""
    view = write_nest(tmp_path, files={"megatron_lm/misc/log.yaml": (
        "log_interval: 1\ntokenizer_type: GPTSentencePieceTokenizer\n"
        "tokenizer_model: /models/llama/tokenizer.model\n")})
    config = build_config(view)
    assert "tokenizer_model" not in config.flat
    assert config.ignored["tokenizer_model"] == ACCEPTED["tokenizer_model"]
    run, _ = run_config_of(config, world_size=1)
    assert (run.data.tokenizer_type, run.data.tokenizer_model) == ("NullTokenizer", None)

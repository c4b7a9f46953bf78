"""MegatronWrap.from_pretrained / save_pretrained through examples/wrap/hf_finetune.py on 2 ranks
(packed, dynamic CP): the held-out loss before training equals transformers' on the original
checkpoint, and after training equals transformers' on the checkpoint save_pretrained wrote.
"""

import importlib.util
import math
import os
from pathlib import Path

import numpy as np
import torch

from tests.harness.extras import needs_extra
from tests.harness.multirank import run_distributed

pytestmark = needs_extra("hf")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "wrap" / "hf_finetune.py"
STEPS = 2
RTOL = 1e-5


def rank_example(out_dir: str, tiny_dir: str) -> dict:
    spec = importlib.util.spec_from_file_location("wrap_example_hf_finetune", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(["--steps", str(STEPS), "--out", out_dir, "--tiny-dir", tiny_dir,
                        "--override", "training.global_batch_size=4"])


@torch.no_grad()
def _transformers_loss(hf_dir: str, records: list[dict]) -> float:
    """Per-token mean loss over the assistant tokens, with transformers' forward."""
    import transformers

    from megatron.varlen_training.datasets.sft import encode_turns, parse_turns
    from megatron.varlen_training.tokenizer import build_tokenizer

    tokenizer = build_tokenizer("HuggingFaceTokenizer", tokenizer_model=hf_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    total, count = 0.0, 0
    for record in records:
        ids, is_target = encode_turns(parse_turns(record), tokenizer)
        logits = model(input_ids=torch.as_tensor(ids[None, :-1])).logits[0].float()
        losses = torch.nn.functional.cross_entropy(logits, torch.as_tensor(ids[1:]),
                                                   reduction="none")
        mask = torch.as_tensor(np.asarray(is_target[1:], dtype=np.float32))
        total += float((losses * mask).sum())
        count += int(mask.sum())
    return total / count


def test_from_pretrained_finetune_save_pretrained(tmp_path):
    results = run_distributed(rank_example, 2, timeout_s=240,
                              args=(str(tmp_path / "out"), str(tmp_path / "tiny")))
    first = results[0]
    assert [r["before"] for r in results] == [first["before"]] * 2
    assert all(math.isfinite(m["loss"]) for m in first["history"])
    assert len(first["history"]) == STEPS
    before = _transformers_loss(first["hf_dir"], first["held_out"])
    assert abs(first["before"] - before) <= RTOL * before, (first["before"], before)
    after = _transformers_loss(first["out"], first["held_out"])
    assert abs(first["after"] - after) <= RTOL * after, (first["after"], after)
    assert abs(after - before) > 1e-4, "training changed nothing"
    assert (Path(first["out"]) / "tokenizer.json").is_file()


def test_pretrained_config_takes_model_and_tokenizer_from_the_directory(tmp_path):
    import pytest

    from megatron.varlen_training.arguments import ArgumentValidationError, build_parser, parse_args
    from megatron.wrap.config import build_config, config_path
    from megatron.wrap.pretrained import pretrained_config
    from tests.unit_tests.varlen_training.hf.tiny_models import save_hf_model, save_tokenizer

    hf_dir = save_hf_model("llama", tmp_path / "llama")
    save_tokenizer("chatml", hf_dir)
    training_only = {"__select__": {"parallel": "single", "optimizer": "adam_cosine"},
                     "model": {"seq_length": 64}, "training": {"train_iters": 10},
                     "flow": {"flow_name": "gpt_sft"}}
    config = pretrained_config(build_config(training_only), hf_dir)
    assert (config.flat["tokenizer_type"], config.flat["tokenizer_model"]) == (
        "HuggingFaceTokenizer", hf_dir)
    args = parse_args(config.to_argv(build_parser()) + ["--mock-data"], world_size=1)
    assert (args.num_layers, args.hidden_size, args.num_query_groups) == (4, 64, 2)
    # A config that also names a model (tiny_gpt: 2 layers) disagrees with the checkpoint.
    with_model = pretrained_config(build_config(config_path("sft_tiny_cpu")), hf_dir)
    with pytest.raises(ArgumentValidationError, match="--num-layers 2 conflicts"):
        parse_args(with_model.to_argv(build_parser()), world_size=1)

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

from megatron.varlen.testing.multirank import run_distributed

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

    from megatron.training.datasets.sft import encode_turns, parse_turns
    from megatron.training.tokenizer import build_tokenizer

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

"""Training through the real entry paths gives the SAME numbers with RoPE from one table per
micro-batch as with megatron-core's own RoPE: every iteration's loss and every rank's last-step
gradient buffers equal (torch.equal), for a GPT with MTP (its layers use the same attention class
on a padded-as-real copy of the micro-batch) and a hybrid Mamba stack (M*M-), both packed with
dynamic CP over 2 ranks. The attention-level and single-model checks are in
tests/unit_tests/varlen/attention/test_packed_rope*.py.
"""

import pytest
import torch

from megatron.varlen.attention.cp_switching import CPSwitchingSelfAttention
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import train_with_grads_on_this_rank
from tests.unit_tests.varlen_training import test_hybrid_equivalence as hybrid
from tests.unit_tests.varlen_training import test_packing_equivalence as packing

WORLD = 2
DYNAMIC_CP2 = ["--dynamic-context-parallel", "--context-parallel-size", "2",
               "--max-seqlen-per-dp-cp-rank", "32"]  # sequences over 32 tokens need CP 2
CASES = {  # name: (argv, hybrid, attention layers: the GPT's 2 and MTP's 1; M*M-'s 1)
    "gpt_mtp": (packing.PACKED + DYNAMIC_CP2 + ["--mtp-num-layers", "1"], False, 3),
    "hybrid": (hybrid.PACKED + DYNAMIC_CP2, True, 1),
}


def rank_train(argv: list[str], is_hybrid: bool, one_table: bool) -> dict:
    """A training run on this rank with the layers' RoPE path chosen (a class default, read when
    each layer runs; this rank process only), and how many attention layers ran."""
    CPSwitchingSelfAttention.rope_from_one_table = one_table
    layers_run = set()
    forward = CPSwitchingSelfAttention.forward

    def recording_forward(self, *args, **kwargs):
        layers_run.add(id(self))
        return forward(self, *args, **kwargs)

    CPSwitchingSelfAttention.forward = recording_forward
    result = train_with_grads_on_this_rank(argv, is_hybrid)
    return {**result, "attention_layers": len(layers_run)}


@pytest.mark.parametrize("case", list(CASES))
def test_training_is_bitwise_the_same_with_either_rope_path(case):
    argv, is_hybrid, attention_layers = CASES[case]
    runs = {one_table: run_distributed(rank_train, WORLD, args=(argv, is_hybrid, one_table),
                                       timeout_s=300)
            for one_table in (True, False)}
    for new, old in zip(runs[True], runs[False]):
        assert [h["lm_loss"] for h in new["history"]] == [h["lm_loss"] for h in old["history"]]
        assert len(new["grads"]) == len(old["grads"]) > 0
        for new_grad, old_grad in zip(new["grads"], old["grads"]):
            assert torch.equal(new_grad, old_grad), f"{case}, rank {new['rank']}"
        assert new["attention_layers"] == old["attention_layers"] == attention_layers  # MTP ran

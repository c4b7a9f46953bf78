"""Every flag pretrain_gpt.py / pretrain_mamba.py shares with Megatron-LM has Megatron-LM's
default, unless listed here with the reason: a run given the same command line is the same run.

Reference: Megatron-LM's defaults as facts read off its arguments (core_v0.8.0 and
core_v0.16.1), megatron/wrap/config/megatron_lm_defaults.json; a default that matches either
release is Megatron-LM's. This caught --num-query-groups, whose unset value gave one key/value
group per head under --group-query-attention where Megatron-LM's default is one group.
"""

import json
from pathlib import Path

from megatron.varlen_training.hybrid_arguments import build_hybrid_parser

DEFAULTS_FILE = (Path(__file__).resolve().parents[3]
                 / "megatron/wrap/config/megatron_lm_defaults.json")
DIFFERENT = {
    "num_query_groups": "unset means Megatron-LM's 1 under --group-query-attention and one "
                        "group per head without it (arguments.py resolves it)",
    "micro_batch_size": "Megatron-LM has none (it must be given); 1 is a packed micro-batch",
    "tokenizer_type": "Megatron-LM has none (it must be given); mock data needs no tokenizer",
    "wandb_project": "unset (None) instead of '': no wandb run",
    "wandb_exp_name": "unset (None) instead of ''",
    "wandb_save_dir": "unset (None) instead of ''",
    "cp_comm_type": "unset means all_gather, the only one implemented (p2p is refused)",
    "no_load_optim": "False instead of None: the same (the optimizer state is loaded)",
    "no_load_rng": "False instead of None: the same (the RNG state is loaded)",
    "no_save_optim": "False instead of None: the same (the optimizer state is saved)",
    "no_save_rng": "False instead of None: the same (the RNG state is saved)",
    "high_priority_stream_groups": "a refused flag, unset (None); Megatron-LM's empty list is "
                                   "accepted as the value that changes nothing",
    "moe_token_dispatcher_type": "unset: alltoall with packing (allgather cannot pack), else "
                                 "Megatron-LM's allgather (moe_arguments.py)",
    "async_save": "False instead of None: the same (a synchronous save; --async-save is "
                  "refused)",
    "vocab_extra_ids": "a refused flag, unset (None); Megatron-LM's 0 is accepted as the value "
                       "that changes nothing (tokenizer_arguments.py)",
    "cuda_graph_scope": "a refused flag, unset (None) instead of Megatron-LM's [] (an empty "
                        "list is not a value a command line can give; kernel_arguments.py)",
    "distributed_backend": "unset (None): the device's, nccl on CUDA and gloo on CPU "
                           "(runtime_arguments.py); Megatron-LM's nccl is accepted on CUDA",
}


def _same(ours, theirs) -> bool:
    numbers = (int, float)
    if isinstance(ours, numbers) and isinstance(theirs, numbers) \
            and not isinstance(ours, bool) and not isinstance(theirs, bool):
        return float(ours) == float(theirs)
    return ours == theirs


def test_shared_flags_have_megatron_lms_defaults():
    megatron_lm = json.loads(DEFAULTS_FILE.read_text())
    ours = {action.dest: action.default for action in build_hybrid_parser().flag_actions
            if action.dest != "help"}
    shared = {dest for dest in ours if dest in megatron_lm}
    assert len(shared) > 100, len(shared)  # the comparison covers the flag set
    differing = {dest: (ours[dest], megatron_lm[dest]) for dest in sorted(shared)
                 if not any(_same(ours[dest], value) for value in megatron_lm[dest])}
    assert set(differing) == set(DIFFERENT), differing

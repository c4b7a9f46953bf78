"""Acceptance: a tiny megatron-core GPTModel built from our spec gives the same per-token
losses for a packed THD micro-batch of lengths {7, 16, 33, 1} as for each sequence run alone,
with and without context parallelism (static CP=2, and CP=2 brought by the micro-batch), and
the same parameter gradients.

Shape legend: T = packed padded tokens (64 here), T_r = T / cp, V = vocab.
"""

import pytest
import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron.varlen.packing.cp_split import gather_thd_from_cp, split_thd_for_cp
from megatron.varlen.model.spec import get_varlen_gpt_layer_spec
from tests.harness.multirank import run_distributed

REAL_LENGTHS = [7, 16, 33, 1]
PAD_MULTIPLE = 4  # 2 * cp for cp 2
VOCAB, HIDDEN, HEADS, KV_GROUPS, LAYERS = 64, 32, 4, 2, 2
MODEL_SEED, DATA_SEED = 1234, 99
LOSS_TOLERANCE = 2e-5
GRAD_TOLERANCE = 2e-5


def _cu(lengths):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)


def _build_model(cp_size):
    torch.manual_seed(MODEL_SEED)  # identical weights on every rank (TP=1, CPU init)
    config = TransformerConfig(
        num_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS,
        num_query_groups=KV_GROUPS, ffn_hidden_size=2 * HIDDEN, hidden_dropout=0.0,
        attention_dropout=0.0, use_cpu_initialization=True, context_parallel_size=cp_size,
        params_dtype=torch.float32,
    )
    return GPTModel(config, get_varlen_gpt_layer_spec(), vocab_size=VOCAB,
                    max_sequence_length=128, position_embedding_type="rope")


def _make_batch():
    """Packed tokens/labels/positions [1, T] (pads: token 0, label 0) and PackedSeqParams."""
    gen = torch.Generator().manual_seed(DATA_SEED)
    padded = [(L + PAD_MULTIPLE - 1) // PAD_MULTIPLE * PAD_MULTIPLE for L in REAL_LENGTHS]
    tokens, labels, positions, real_rows = [], [], [], []
    for real, pad in zip(REAL_LENGTHS, padded):
        seq = torch.randint(0, VOCAB, (real + 1,), generator=gen)
        real_rows.extend(range(sum(map(len, tokens)), sum(map(len, tokens)) + real))
        tokens.append(torch.cat([seq[:-1], torch.zeros(pad - real, dtype=torch.long)]))
        labels.append(torch.cat([seq[1:], torch.zeros(pad - real, dtype=torch.long)]))
        positions.append(torch.arange(pad))
    params = PackedSeqParams(
        qkv_format="thd", cu_seqlens_q=_cu(REAL_LENGTHS), cu_seqlens_kv=_cu(REAL_LENGTHS),
        cu_seqlens_q_padded=_cu(padded), cu_seqlens_kv_padded=_cu(padded),
        max_seqlen_q=max(padded), max_seqlen_kv=max(padded),
    )
    batch = {k: torch.cat(v)[None] for k, v in
             (("tokens", tokens), ("labels", labels), ("positions", positions))}
    return batch, params, torch.tensor(real_rows)


def _forward_backward(model, batch, params, real_mask):
    """Per-token losses [1, tokens] and the grads of sum(real-token losses)."""
    model.zero_grad(set_to_none=True)
    loss = model(batch["tokens"], batch["positions"], None, labels=batch["labels"],
                 packed_seq_params=params)
    (loss * real_mask).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return loss.detach().clone(), grads


def _alone_losses(model, batch, params):
    """Each real sequence on its own, unpacked (sbhd, batch 1): losses in the packed layout."""
    out = torch.zeros(batch["tokens"].shape[1])
    starts, reals = params.cu_seqlens_q_padded.tolist(), REAL_LENGTHS
    for start, real in zip(starts, reals):
        piece = {k: v[:, start:start + real] for k, v in batch.items()}
        piece["positions"] = torch.arange(real)[None]
        loss = model(piece["tokens"], piece["positions"], None, labels=piece["labels"])
        out[start:start + real] = loss.detach()[0]
    return out


def _cp_run(model, batch, params, real_mask, group):
    """This rank's CP slice of the packed micro-batch; losses gathered, grads summed over CP."""
    cu = params.cu_seqlens_q_padded
    split = lambda x: split_thd_for_cp(x, cu, group.size(), group.rank(), seq_dim=1)
    local = {k: split(v) for k, v in batch.items()}
    loss, grads = _forward_backward(model, local, params, split(real_mask))
    for grad in grads.values():
        dist.all_reduce(grad, group=group)
    return gather_thd_from_cp(loss, cu, group, seq_dim=1)[0], grads


def _compare(expected_loss, expected_grads, loss, grads, rows):
    loss_err = float((loss[rows] - expected_loss[rows]).abs().max())
    grad_err = max(float((grads[n] - g).abs().max()) for n, g in expected_grads.items())
    return loss_err, grad_err


def rank_acceptance():
    batch, params, rows = _make_batch()
    real_mask = torch.zeros_like(batch["tokens"], dtype=torch.float32)
    real_mask[0, rows] = 1.0
    results = {}
    parallel_state.initialize_model_parallel()  # static CP 1, DP 2
    model = _build_model(cp_size=1)
    alone = _alone_losses(model, batch, params)
    packed_loss, packed_grads = _forward_backward(model, batch, params, real_mask)
    results["packed_vs_alone"] = float((packed_loss[0, rows] - alone[rows]).abs().max())
    params.cp_group, params.local_cp_size = dist.group.WORLD, dist.get_world_size()
    loss, grads = _cp_run(model, batch, params, real_mask, dist.group.WORLD)
    results["dynamic_cp2"] = _compare(alone, packed_grads, loss, grads, rows)
    params.cp_group = params.local_cp_size = None
    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(context_parallel_size=2)
    try:
        model = _build_model(cp_size=2)
        group = parallel_state.get_context_parallel_group()
        loss, grads = _cp_run(model, batch, params, real_mask, group)
        results["static_cp2"] = _compare(alone, packed_grads, loss, grads, rows)
        params.local_cp_size = 1  # a micro-batch with CP off under static CP 2: full pack
        loss, grads = _forward_backward(model, batch, params, real_mask)
        results["local_cp_size_1"] = _compare(alone, packed_grads, loss[0], grads, rows)
    finally:
        parallel_state.destroy_model_parallel()
    return results


@pytest.fixture(scope="module")
def acceptance():
    return run_distributed(rank_acceptance, world_size=2, timeout_s=120)


def test_packed_thd_losses_equal_each_sequence_alone(acceptance):
    for result in acceptance:
        assert result["packed_vs_alone"] < LOSS_TOLERANCE


@pytest.mark.parametrize("case", ["dynamic_cp2", "static_cp2", "local_cp_size_1"])
def test_cp_losses_and_grads_equal_single_rank(acceptance, case):
    for result in acceptance:
        loss_err, grad_err = result[case]
        assert loss_err < LOSS_TOLERANCE, f"{case}: per-token loss differs by {loss_err}"
        assert grad_err < GRAD_TOLERANCE, f"{case}: parameter grads differ by {grad_err}"

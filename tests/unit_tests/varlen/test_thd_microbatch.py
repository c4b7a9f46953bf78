"""THD packing of one micro-batch and its per-rank view, against hand-built expectations."""

import torch

from megatron.varlen.packing.thd_microbatch import build_model_inputs, dummy_pack, pack_sequences

PAD = 99


def _seq(length: int, start: int) -> dict:
    tokens = torch.arange(start, start + length)
    return {"tokens": tokens, "labels": tokens + 1, "loss_mask": torch.ones(length)}


def test_pack_pads_each_sequence_and_keeps_real_boundaries():
    seqs = [_seq(3, 10), _seq(1, 20), _seq(5, 30)]
    originals = [{k: v.clone() for k, v in s.items()} for s in seqs]
    pack = pack_sequences(seqs, [4, 4, 8], local_cp_size=2, pad_id=PAD, sample_ids=(5, 6, 7))
    assert pack.tokens.tolist() == [10, 11, 12, PAD, 20, PAD, PAD, PAD,
                                    30, 31, 32, 33, 34, PAD, PAD, PAD]
    assert pack.loss_mask.tolist() == [1, 1, 1, 0, 1, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0]
    # Real tokens count 0..L-1; padding positions are 0 (Megatron-LM sanitises them alike).
    assert pack.position_ids.tolist() == [0, 1, 2, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 0, 0, 0]
    assert pack.cu_seqlens.tolist() == [0, 3, 4, 9]
    assert pack.cu_seqlens_padded.tolist() == [0, 4, 8, 16]
    assert pack.max_seqlen == 8 and pack.real_tokens == 9 and pack.sample_ids == (5, 6, 7)
    for seq, orig in zip(seqs, originals):  # samples are never modified
        assert all(torch.equal(seq[k], orig[k]) for k in orig)


def test_model_inputs_split_each_sequence_for_cp():
    pack = pack_sequences([_seq(3, 10), _seq(5, 30)], [4, 8], local_cp_size=2, pad_id=PAD)
    rank0 = build_model_inputs(pack, cp_rank=0, cp_group="G", device="cpu")
    rank1 = build_model_inputs(pack, cp_rank=1, cp_group="G", device="cpu")
    # Sequence 1 (padded 4) -> chunks of 1: rank 0 keeps chunks 0 and 3, rank 1 chunks 1 and 2.
    # Sequence 2 (padded 8) -> chunks of 2: rank 0 keeps [0:2] and [6:8], rank 1 [2:4], [4:6].
    assert rank0["tokens"].tolist() == [[10, PAD, 30, 31, PAD, PAD]]
    assert rank1["tokens"].tolist() == [[11, 12, 32, 33, 34, PAD]]
    assert rank0["position_ids"].tolist() == [[0, 0, 0, 1, 0, 0]]
    assert rank1["position_ids"].tolist() == [[1, 2, 2, 3, 4, 0]]
    params = rank0["packed_seq_params"]
    assert params.qkv_format == "thd" and params.local_cp_size == 2 and params.cp_group == "G"
    assert params.cu_seqlens_q.tolist() == [0, 3, 8]
    assert params.cu_seqlens_q_padded.tolist() == [0, 4, 12]
    assert params.max_seqlen_q == 8


def test_size_one_group_has_no_cp_group_and_no_split():
    pack = pack_sequences([_seq(3, 10)], [3], local_cp_size=1, pad_id=PAD)
    inputs = build_model_inputs(pack, cp_rank=0, cp_group="ignored", device="cpu")
    assert inputs["tokens"].tolist() == [[10, 11, 12]]
    assert inputs["packed_seq_params"].cp_group is None


def test_dummy_pack_is_masked_and_sp_divisible():
    pack = dummy_pack(PAD, sp_factor=2)
    assert pack.tokens.numel() % 2 == 0 and pack.loss_mask.sum() == 0 and pack.real_tokens == 0
    # Real length == padded length: no attention row is fully masked (no NaN).
    assert pack.cu_seqlens.tolist() == pack.cu_seqlens_padded.tolist()


def test_filler_and_idle_positions_are_zero():
    # A fixed pack length (VPP) tops the pack up with a filler; an idle rank gets a dummy pack.
    pack = pack_sequences([_seq(3, 10)], [4], local_cp_size=1, pad_id=PAD, sample_ids=(0,),
                          total_tokens=10)
    assert pack.position_ids.tolist() == [0, 1, 2, 0, 0, 0, 0, 0, 0, 0]
    assert pack.cu_seqlens_padded.tolist() == [0, 4, 10] and pack.real_tokens == 3
    assert dummy_pack(PAD, sp_factor=2, total_tokens=8).position_ids.tolist() == [0] * 8


def test_positions_never_exceed_the_real_length():
    lengths, padded = [5, 1, 7], [8, 4, 8]
    pack = pack_sequences([_seq(n, 0) for n in lengths], padded, local_cp_size=2, pad_id=PAD,
                          total_tokens=24)
    starts = pack.cu_seqlens_padded.tolist()
    for k, length in enumerate(lengths):
        positions = pack.position_ids[starts[k]: starts[k + 1]]
        assert positions[:length].tolist() == list(range(length))
        assert int(positions.max()) <= length - 1

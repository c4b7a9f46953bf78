"""The facade trains exactly what pretrain_gpt.py trains: same samples and config, same losses.

Each launch runs, on the same ranks, ``pretrain_gpt.py``'s path (``train_on_this_rank``) and then
``MegatronWrap.train`` for 3 steps on the samples the mock SFT dataset yields for the same flags
(global batch ``step`` = samples ``step * gbs .. step * gbs + gbs - 1``), with packing, for
TP=2, PP=2, static CP=2, dynamic CP and an MoE model with expert parallelism (EP=2): same loss
and grad norm at every step, and for MoE the same balancing and z-losses. Every rank must
report the loss (PP included). The TP launch also feeds the batch on rank 0 only; the CP launch
also checks that a flow's extra per-token field is packed and CP-split exactly like the loss
mask.
"""

import dataclasses

import pytest
import torch

from megatron.varlen_training.arguments import build_parser
from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.datasets.builder import build_datasets
from megatron.varlen_training.tokenizer import build_tokenizer
from megatron.wrap import GPTFlow, MegatronWrap, register_flow
from megatron.wrap.config import build_config
from tests.harness.multirank import run_distributed
from tests.harness.training_runs import loss_owner_history, train_on_this_rank

RTOL = 1e-5
NUM_STEPS = 3
GLOBAL_BATCH = 8
LENGTHS = {"mode": "distribution", "type": "lognormal", "min_seq_len": 1, "max_seq_len": 64,
           "mean_seq_len": 20, "lognormal_sigma": 1.0}
BASE = {
    "model": {"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 64,
              "vocab_size": 128, "make_vocab_size_divisible_by": 32, "hidden_dropout": 0.0,
              "attention_dropout": 0.0, "position_embedding_type": "rope"},
    "training": {"micro_batch_size": 1, "global_batch_size": GLOBAL_BATCH,
                 "train_iters": NUM_STEPS, "lr": 2e-3, "seed": 11, "eval_iters": 0,
                 "log_interval": 1},
    "data": {"mock_data": True, "sft": True, "sft_mock_dataset_config_json": LENGTHS,
             "tokenizer_type": "NullTokenizer"},
    "logging": {"metric_writers": [], "progress_bar": False},
}
LAYOUTS = {  # name: (parallel section, world size)
    "tp2_dp2": ({"tensor_model_parallel_size": 2, "sequence_parallel": True}, 4),
    "pp2_dp2": ({"pipeline_model_parallel_size": 2}, 4),
    "cp2_dp2": ({"context_parallel_size": 2}, 4),
    "dynamic_cp_dp2": ({"dynamic_context_parallel": True, "max_seqlen_per_dp_cp_rank": 32}, 2),
    "moe_ep2": ({"expert_model_parallel_size": 2}, 2),
}
MODELS = {  # layout: model keys beside BASE's
    "moe_ep2": {"num_experts": 4, "moe_router_topk": 2, "moe_ffn_hidden_size": 16,
                "moe_aux_loss_coeff": 0.01, "moe_z_loss_coeff": 0.001,
                "disable_bias_linear": True},
}
MOE_LOSSES = ("load_balancing_loss", "z_loss")


class MaskCopyFlow(GPTFlow):
    """GPTFlow plus an extra per-token field equal to the loss mask, checked in every pack."""

    def fields_and_seq_dims(self):
        return {**super().fields_and_seq_dims(), "mask_copy": 0, "length_copy": None}

    def build_sample(self, raw, index):
        copies = {"mask_copy": raw["loss_mask"], "length_copy": raw["length"]}
        return super().build_sample({**raw, **copies}, index)

    def collate_micro_batch(self, micro_batch):
        assert torch.equal(micro_batch["mask_copy"], micro_batch["loss_mask"].float())
        params = micro_batch["packed_seq_params"]
        real = (params.cu_seqlens_q[1:] - params.cu_seqlens_q[:-1]).float()
        assert torch.equal(micro_batch["length_copy"], real[: len(micro_batch["sample_ids"])])
        return super().collate_micro_batch(micro_batch)


register_flow("test_mask_copy", MaskCopyFlow, replace=True)


def _config(parallel: dict, model: dict | None = None) -> dict:
    return {**BASE, "model": {**BASE["model"], **(model or {})},
            "parallel": {"sequence_packing": True, **parallel}}


def _dataset_batches(argv: list[str]) -> list[list[dict]]:
    """The samples pretrain_gpt.py reads: global batch s = dataset[s * gbs + j]."""
    run = parse_run_config(argv, world_size=torch.distributed.get_world_size())
    run = dataclasses.replace(run, data=dataclasses.replace(
        run.data, train_samples=NUM_STEPS * GLOBAL_BATCH, eval_samples=0))
    train_ds, _ = build_datasets(run, build_tokenizer(run.data.tokenizer_type,
                                                      run.model.vocab_size))
    return [[train_ds[s * GLOBAL_BATCH + j] for j in range(GLOBAL_BATCH)]
            for s in range(NUM_STEPS)]


def _facade_run(config: dict, batches, source: str) -> dict:
    """Losses of 3 train steps, the forward-only loss of batch 0 first, and the layout."""
    with MegatronWrap(config) as wrap:
        wrap.initialize().setup_model_and_optimizer()
        given = [batch if source == "all_ranks" or wrap.rank == 0 else None for batch in batches]
        evaluated = wrap.evaluate(given[0], source=source)["loss"]
        steps = [wrap.train(batch, source=source) for batch in given]
        sizes = {axis: getattr(wrap, f"{axis}_size") for axis in ("tp", "pp", "cp", "dp")}
        return {"losses": [step["loss"] for step in steps], "evaluated": evaluated,
                "grad_norms": [step["grad_norm"] for step in steps], "sizes": sizes,
                "moe": [{key: step[key] for key in MOE_LOSSES if key in step}
                        for step in steps]}


def rank_trajectory(parallel: dict, variants: tuple[tuple[str, str], ...],
                    model: dict | None = None) -> dict:
    """pretrain_gpt.py's path, then the facade per (flow, batch source) variant."""
    config = _config(parallel, model)
    argv = build_config(config).to_argv(build_parser())
    reference = train_on_this_rank(argv)
    batches = _dataset_batches(argv)
    facade = {f"{flow}/{source}": _facade_run(
        {**config, "flow": {"flow_name": flow}}, batches, source) for flow, source in variants}
    return {"reference": reference, "facade": facade}


VARIANTS = {
    "tp2_dp2": (("gpt_sft", "all_ranks"), ("gpt_sft", "rank0")),
    "pp2_dp2": (("gpt_sft", "all_ranks"),),
    "cp2_dp2": (("gpt_sft", "all_ranks"), ("test_mask_copy", "all_ranks")),
    "dynamic_cp_dp2": (("test_mask_copy", "rank0"),),
    "moe_ep2": (("gpt_sft", "all_ranks"),),
}


SIZES = {"tp2_dp2": (2, 1, 1, 2), "pp2_dp2": (1, 2, 1, 2), "cp2_dp2": (1, 1, 2, 2),
         "dynamic_cp_dp2": (1, 1, 1, 2), "moe_ep2": (1, 1, 1, 2)}  # tp, pp, cp, dp


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_facade_matches_pretrain_gpt(layout):
    parallel, world = LAYOUTS[layout]
    results = run_distributed(rank_trajectory, world,
                              args=(parallel, VARIANTS[layout], MODELS.get(layout)),
                              timeout_s=240)
    history = loss_owner_history([r["reference"] for r in results])
    want = [h["lm_loss"] for h in history]
    want_norms = [h["grad_norm"] for h in history]
    assert len(want) == NUM_STEPS and len(set(want)) == NUM_STEPS, want  # the loss moves
    for rank, result in enumerate(results):
        for variant, run in result["facade"].items():
            where = f"{layout} rank {rank} {variant}"
            assert tuple(run["sizes"].values()) == SIZES[layout], (where, run["sizes"])
            # evaluate() before the first step scores what train() then reports for step 1
            assert abs(run["evaluated"] - want[0]) <= RTOL * abs(want[0]), where
            for step, (got, ref) in enumerate(zip(run["losses"], want, strict=True), start=1):
                assert abs(got - ref) <= RTOL * abs(ref), (
                    f"{where} step {step}: facade {got!r} vs pretrain_gpt {ref!r}")
            # the gradients too: clipping and Adam hide a uniformly scaled one in the losses
            for step, (got, ref) in enumerate(zip(run["grad_norms"], want_norms, strict=True),
                                              start=1):
                assert abs(got - ref) <= RTOL * abs(ref), (
                    f"{where} step {step}: facade grad norm {got!r} vs pretrain_gpt {ref!r}")
            want_moe = [{key: h[key] for key in MOE_LOSSES if key in h} for h in history]
            assert run["moe"] == want_moe, where  # the same code reduces both: exactly equal
            assert all(len(losses) == len(MOE_LOSSES) for losses in want_moe) == \
                (layout in MODELS), (where, want_moe)

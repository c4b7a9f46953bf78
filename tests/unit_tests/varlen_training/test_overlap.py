"""--overlap-grad-reduce / --overlap-param-gather (megatron-core's DDP and distributed optimizer)
never change the numbers: packed, on 2 gloo ranks, the losses, grad norms, validation losses and
saved weights equal the run without overlap, bit for bit.

The runs share one launch (the trainers run one after another on the same process group). With
overlapped gathers the weights are current only after the next forward: the final save must
gather them first (training.params_gathered), which the saved checkpoint's weights check (runs
without evaluation, whose forward would gather them); evaluation is checked by its losses.
"""

import hashlib
import os

import pytest
import torch

from megatron.varlen_training.config.from_flags import parse_run_config
from megatron.varlen_training.hf.export_tool import load_model_weights
from megatron.varlen_training.pretrain import pretrain
from megatron.varlen_training.trainer import Trainer
from tests.harness.multirank import run_distributed

WORLD = 2
PACKED = [
    "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
    "--seq-length", "64", "--micro-batch-size", "1", "--global-batch-size", "8",
    "--train-iters", "3", "--lr", "2e-3", "--mock-data", "--sft", "--tokenizer-type",
    "NullTokenizer", "--vocab-size", "128", "--make-vocab-size-divisible-by", "32",
    "--hidden-dropout", "0", "--attention-dropout", "0", "--log-interval", "1",
    "--eval-iters", "0", "--seed", "5", "--sequence-packing", "--use-distributed-optimizer",
]
OVERLAP_BOTH = ["--overlap-grad-reduce", "--overlap-param-gather"]
# Without evaluation the final save follows the last update directly: no forward has gathered
# the weights (an evaluation's forward would, through DDP's hooks).
EVALUATE = ["--eval-iters", "1", "--eval-interval", "1"]
VARIANTS = {
    "off": [],
    "overlap_grad_reduce": ["--overlap-grad-reduce"],
    "overlap_both": OVERLAP_BOTH,
    "off_evaluated": EVALUATE,
    "overlap_both_evaluated": OVERLAP_BOTH + EVALUATE,
}


def _saved_weights_digest(root: str, model) -> str:
    """The model weights of the checkpoint saved under ``root`` (loaded into ``model``)."""
    load_model_weights(root, model)
    digest = hashlib.sha256()
    for chunk in model:
        for param in chunk.parameters():
            digest.update(param.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _train_variants(root: str, variants: dict = VARIANTS, base: list[str] = PACKED) -> dict:
    results = {}
    for name, extra in variants.items():
        save = os.path.join(root, name)
        run = parse_run_config(base + extra + ["--save", save],
                               world_size=torch.distributed.get_world_size())
        trainer = Trainer(run)
        try:
            history = pretrain(trainer)
            model = trainer.state.model
            hooked = [getattr(chunk, "use_forward_hook", False) for chunk in model]
            grad_sync = trainer.state.config.grad_sync_func is not None
            saved = _saved_weights_digest(save, model)
        finally:
            trainer.close()
        results[name] = {"history": history, "forward_hooks": hooked, "grad_sync": grad_sync,
                         "saved": saved}
    return results


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("overlap"))
    return run_distributed(_train_variants, WORLD, args=(root,), timeout_s=600)


@pytest.mark.parametrize("variant,reference", [
    ("overlap_grad_reduce", "off"), ("overlap_both", "off"),
    ("overlap_both_evaluated", "off_evaluated")])
def test_overlap_matches_no_overlap(results, variant, reference):
    for rank in results:
        assert rank[variant]["history"] == rank[reference]["history"], variant
        assert rank[variant]["saved"] == rank[reference]["saved"], variant


def test_overlap_is_on(results):
    for rank in results:
        assert rank["overlap_grad_reduce"]["grad_sync"] and not rank["off"]["grad_sync"]
        assert all(rank["overlap_both"]["forward_hooks"])
        assert not any(rank["overlap_grad_reduce"]["forward_hooks"])
    history = results[-1]["off"]["history"]
    assert len({h["lm_loss"] for h in history}) == len(history), "losses must move"
    assert all(h["validation_loss"] is not None
               for h in results[-1]["off_evaluated"]["history"])




# PP2 x DP2 with virtual stages: the schedule starts each chunk's parameter all-gather
# (param_sync_func, aligned gathers) and each chunk's gradient reduction (grad_sync_func).
VPP = PACKED + ["--num-layers", "4", "--pipeline-model-parallel-size", "2",
                "--num-layers-per-virtual-pipeline-stage", "1", "--max-seqlen-per-dp-cp-rank",
                "64"]


def test_overlap_with_virtual_pipeline(tmp_path):
    ranks = run_distributed(_train_variants, 4, timeout_s=900, args=(
        str(tmp_path), {"off": [], "overlap_both": OVERLAP_BOTH}, VPP))
    for rank in ranks:
        assert rank["overlap_both"]["history"] == rank["off"]["history"]
        assert rank["overlap_both"]["saved"] == rank["off"]["saved"]
        assert rank["overlap_both"]["grad_sync"] and all(rank["overlap_both"]["forward_hooks"])

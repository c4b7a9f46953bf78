"""A training step reads nothing back from the device before its grad norm.

Counted on CPU (calls, see tests/unit_tests/varlen/host_reads.py: on CUDA each is a synchronising
device->host copy) through one real packed DP2 step on 2 gloo ranks:

* gradient finalisation (DP all-reduce, per-token division): 0 reads. megatron-core's own
  ``finalize_model_grads`` reads the token count (``if num_tokens > 0``); grad_finalize.py
  does the division on the device;
* the grad norm: exactly 1 read, megatron-core's ``total_norm.item()`` for the grad norm the
  optimizer returns. Its local stand-in for Apex's l2-norm kernel reads every parameter's norm
  (``torch.tensor(list of norms)``) and then the total once more; optimizer_kernels.py keeps
  the norm on the device.

The stock counts are measured in the same run (megatron-core's functions put back), so the
test shows what it would catch. Equal numbers: the equivalence tests run the same code, and
test_optimizer_kernels.py compares the kernels with megatron-core's.
"""

from megatron.varlen_training.optimizer_kernels import device_l2_norm
from tests.harness.multirank import run_distributed
from tests.unit_tests.varlen_training.test_packing_equivalence import PACKED
from tests.unit_tests.varlen.host_reads import CountHostReads

WORLD = 2


def _counted(fn):
    counter = CountHostReads()
    with counter:
        fn()
    return counter.reads


def _step_reads(run, state, provider, iteration):
    """Host reads in the gradient finalisation and in the grad-norm computation of one step.

    Only these two are counted: the model's forward and backward are test_no_host_reads.py's
    (which tells device boundaries from the host copies the data path attaches), and on CPU
    torch's single-tensor Adam reads its host-side step counters (on CUDA the fused kernel
    keeps them on the device).
    """
    from megatron.varlen_training.training import run_forward_backward

    finalize = state.config.finalize_model_grads_func
    reads = {}

    def counted_finalize(*f_args, **f_kwargs):
        reads["finalize"] = _counted(lambda: finalize(*f_args, **f_kwargs))

    state.config.finalize_model_grads_func = counted_finalize
    try:
        for chunk in state.model:
            chunk.zero_grad_buffer()
        state.optimizer.zero_grad()
        run_forward_backward(run, state, provider.step_batches(iteration), False)
    finally:
        state.config.finalize_model_grads_func = finalize
    # What optimizer.step() does before the update: main grads in place, then their norm.
    reads["grad_norm"] = _counted(lambda: (state.optimizer.prepare_grads(),
                                           state.optimizer.get_grad_norm()))
    return reads


def _use_stock_megatron_core(state) -> None:
    from megatron.core import utils
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.optimizer import clip_grads

    state.config.finalize_model_grads_func = finalize_model_grads
    clip_grads.l2_norm_impl = utils.local_multi_tensor_l2_norm


def rank_reads(argv):
    from megatron.varlen_training.config.from_flags import parse_run_config
    from megatron.varlen_training.pretrain import build_data_providers
    from megatron.varlen_training.trainer import Trainer
    from megatron.varlen_training.training import train_step

    import torch

    trainer = Trainer(parse_run_config(argv, world_size=torch.distributed.get_world_size()))
    try:
        run = trainer.start().run
        provider = build_data_providers(trainer).train
        state = trainer.setup_model_and_optimizer()
        train_step(run, state, provider.step_batches(0))  # warm-up: state, buffers, layouts
        ours = _step_reads(run, state, provider, 1)
        _use_stock_megatron_core(state)
        return {"ours": ours, "stock": _step_reads(run, state, provider, 2)}
    finally:
        from megatron.core.optimizer import clip_grads

        clip_grads.l2_norm_impl = device_l2_norm
        trainer.close()


def test_packed_step_reads_only_the_grad_norm():
    for rank in run_distributed(rank_reads, WORLD, args=(PACKED,), timeout_s=240):
        assert rank["ours"] == {"finalize": [], "grad_norm": ["item"]}, rank
        # What the test catches: megatron-core's token-count read, and its total norm read
        # before the one it returns (its torch.tensor(list of per-parameter norms), one read
        # per parameter on CUDA, is invisible to a torch function mode).
        assert rank["stock"] == {"finalize": ["__bool__"], "grad_norm": ["__float__", "item"]}, \
            rank

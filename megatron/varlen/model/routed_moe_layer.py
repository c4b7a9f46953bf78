"""``VarlenMoELayer``: megatron-core's ``MoELayer`` whose ``--recompute-modules moe``
recomputation routes with the micro-batch it was called for.

The layer hands its router the micro-batch (packed boundaries, MTP shift, an unpacked
micro-batch's sequence map) for the duration of the layer's forward
(:class:`~megatron.varlen.model.moe_spec.RoutesMicroBatch`). megatron-core 0.16.1 checkpoints
the MoE layer on its own (``recompute_modules`` "moe"), so backward re-runs the routing after
that forward has returned: the router would see no micro-batch and build the wrong sequence
map (probed: gradients 4e-3 off). This layer checkpoints itself instead, binding the router's
micro-batch of the call into the checkpointed function; everything else is megatron-core's
forward, under megatron-core's ``tensor_parallel.checkpoint`` (RNG states restored, inputs
saved, the forward run without grad: the balancing losses attach, global_aux_loss's running
counts and megatron-core's expert-bias token counts grow once, in the recomputation). FP8
(megatron-core's TE checkpoint there) is refused at start-up.

The layer spec keeps megatron-core's ``MoELayer``: megatron-core 0.16.1's ``TransformerLayer``
hands its process groups only to the MLP classes it names (any other gets the global defaults,
with a warning per layer), so the layer adopts the built ``MoELayer`` instead
(:meth:`VarlenMoELayer.adopt`, called by
:class:`~megatron.varlen.model.moe_spec.RoutesMicroBatch`).
"""

from __future__ import annotations

from megatron.core import tensor_parallel
from megatron.core.transformer.moe.moe_layer import MoELayer


class VarlenMoELayer(MoELayer):
    """``MoELayer`` (same constructor and forward) recomputed in its call's micro-batch."""

    recompute_in_micro_batch = False

    @classmethod
    def adopt(cls, moe_layer: MoELayer) -> None:
        """Makes the ``MoELayer`` a :class:`VarlenMoELayer` (it adds no state but the flag):
        its ``moe`` recomputation, which megatron-core's forward would run without the
        router's micro-batch, is taken over here."""
        assert type(moe_layer) is MoELayer, type(moe_layer)
        moe_layer.__class__ = cls
        moe_layer.recompute_in_micro_batch = moe_layer.moe_layer_recompute
        moe_layer.moe_layer_recompute = False

    def forward(self, hidden_states, intermediate_tensors=None, padding_mask=None):
        if not self.recompute_in_micro_batch:
            return super().forward(hidden_states, intermediate_tensors, padding_mask)
        # Bound now, not read in backward: a pipeline schedule recomputes this micro-batch
        # after the forwards of later ones.
        micro_batch = self.router.current_micro_batch()

        def routed_forward(hidden_states, intermediate_tensors, padding_mask):
            with self.router.in_micro_batch(micro_batch):
                return MoELayer.forward(self, hidden_states, intermediate_tensors, padding_mask)

        return tensor_parallel.checkpoint(routed_forward, False, hidden_states,
                                          intermediate_tensors, padding_mask)

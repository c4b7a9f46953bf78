"""How many decoder layers each pipeline stage (and virtual stage) builds, and where they start.

The arithmetic is megatron-core's own (``get_num_layers_to_build`` and
``get_transformer_layer_offset``, which the model build calls on every rank): this module only
asks it about every stage at once, from the flags, before any process group exists. Flag
validation (pipeline_arguments.py) uses it for the per-chunk checks (recomputation, stages left
without layers); tests use it as the layout the model must build.

A ``--pipeline-model-parallel-layout`` string is parsed by megatron-core's own
``PipelineParallelLayerLayout`` (its grammar: E embedding, t decoder layer, m MTP layer, L loss,
``|`` between stages, ``(...)*N`` / ``x*N`` repeats, cosmetic commas). Its chunk matrix is read
here directly: the class's own per-stage queries ask parallel_state for the virtual pipeline
size, which does not exist before the process groups do.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache


@lru_cache(maxsize=None)
def parse_layout(layout: str, pipeline_model_parallel_size: int):
    """megatron-core's ``PipelineParallelLayerLayout`` of a layout string; its stage count
    must be a multiple of the PP size (megatron-core asserts; pipeline_arguments.py checks
    first). ``layout.layout[pp_rank][vp_stage]`` lists each chunk's layer types."""
    # megatron-core only when the flag is used: the flag layer must not import it otherwise
    from megatron.core.transformer.pipeline_parallel_layer_layout import (
        PipelineParallelLayerLayout,
    )

    return PipelineParallelLayerLayout(layout, pipeline_model_parallel_size)


def layout_chunk_counts(layout: str, pipeline_model_parallel_size: int,
                        layer_type: str = "decoder") -> list[list[int]]:
    """``[pp_rank][vp_stage]``: layers of ``layer_type`` (a megatron-core ``LayerType`` name:
    decoder, mtp, embedding, loss) in each chunk of the layout."""
    from megatron.core.transformer.enums import LayerType

    wanted = LayerType[layer_type]
    return [[chunk.count(wanted) for chunk in rank]
            for rank in parse_layout(layout, pipeline_model_parallel_size).layout]


def layout_chunk_offsets(counts: list[list[int]]) -> list[list[int]]:
    """``[pp_rank][vp_stage]``: index of each chunk's first layer, counting in megatron-core's
    order (every rank's chunk 0, then every rank's chunk 1, ...)."""
    offsets = [[0] * len(rank) for rank in counts]
    seen = 0
    for vp in range(len(counts[0])):
        for rank, rank_counts in enumerate(counts):
            offsets[rank][vp] = seen
            seen += rank_counts[vp]
    return offsets


@dataclass(frozen=True)
class PipelineSplit:
    """The TransformerConfig fields megatron-core's layer placement reads (same names)."""

    num_layers: int
    pipeline_model_parallel_size: int
    virtual_pipeline_model_parallel_size: int | None = None
    num_layers_in_first_pipeline_stage: int | None = None
    num_layers_in_last_pipeline_stage: int | None = None
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    # --pipeline-model-parallel-layout: megatron-core's layout string (None: the flags' split)
    pipeline_model_parallel_layout: str | None = None

    @property
    def uneven(self) -> bool:
        """Whether stages hold other layer counts than --num-layers / PP."""
        return (self.num_layers_in_first_pipeline_stage is not None
                or self.num_layers_in_last_pipeline_stage is not None
                or self.account_for_embedding_in_pipeline_split
                or self.account_for_loss_in_pipeline_split
                or self.pipeline_model_parallel_layout is not None)

    def _virtual_stages(self) -> list[int | None]:
        size = self.virtual_pipeline_model_parallel_size
        return [None] if size is None else list(range(size))

    def chunk_layers(self) -> list[list[int]]:
        """``[pp_rank][vp_stage]``: decoder layers of each model chunk (one chunk without VPP)."""
        if self.pipeline_model_parallel_layout is not None:
            return layout_chunk_counts(self.pipeline_model_parallel_layout,
                                       self.pipeline_model_parallel_size)
        # megatron-core only when asked: the flag layer must not import it (a bad flag ends
        # the run first, tests/unit_tests/test_entry_point_imports.py)
        from megatron.core.transformer.transformer_block import get_num_layers_to_build

        return [[get_num_layers_to_build(self, vp_stage=vp, pp_rank=rank)
                 for vp in self._virtual_stages()]
                for rank in range(self.pipeline_model_parallel_size)]

    def chunk_offsets(self) -> list[list[int]]:
        """``[pp_rank][vp_stage]``: global index of each chunk's first decoder layer."""
        if self.pipeline_model_parallel_layout is not None:
            return layout_chunk_offsets(self.chunk_layers())
        from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

        return [[get_transformer_layer_offset(self, vp_stage=vp, pp_rank=rank)
                 for vp in self._virtual_stages()]
                for rank in range(self.pipeline_model_parallel_size)]

    def stage_layers(self) -> list[int]:
        """Decoder layers of each pipeline stage (all its virtual stages)."""
        if not self.uneven:
            # --num-layers / PP each (validation checked it divides): the even split needs no
            # megatron-core, whose import would come before the entry points join their peers
            # (tests/unit_tests/reliability/test_start_up_without_agent.py)
            stages = self.pipeline_model_parallel_size
            return [self.num_layers // stages] * stages
        return [sum(chunks) for chunks in self.chunk_layers()]


"""Parallel-state shortcuts of the facade: ``wrap.tp_size``, ``wrap.dp_rank``, ``wrap.cp_group``...

Each is a property reading megatron-core's ``parallel_state`` (after ``initialize()``).
``dp`` is data parallelism without context parallelism, as in megatron-core; ``ep`` is expert
model parallelism (1 for the dense models of this fork).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch.distributed as dist

from megatron.core import parallel_state

# axis -> megatron-core getter stem: get_<stem>_world_size / _rank / _group
_AXES = {
    "tp": "tensor_model_parallel",
    "pp": "pipeline_model_parallel",
    "dp": "data_parallel",
    "cp": "context_parallel",
    "ep": "expert_model_parallel",
}


def _require_initialized() -> None:
    if not parallel_state.model_parallel_is_initialized():
        raise RuntimeError("parallel state is not set up: call MegatronWrap.initialize() first")


def _getter(axis: str, what: str) -> property:
    function = getattr(parallel_state, f"get_{_AXES[axis]}_{what}")
    meaning = {"world_size": "size", "rank": "rank of this process", "group": "process group"}

    def read(self):
        _require_initialized()
        return function()

    return property(read, doc=f"{axis.upper()} {meaning[what]} ({function.__name__}).")


class ParallelStateMixin:
    """Adds ``<axis>_size``, ``<axis>_rank`` and ``<axis>_group`` for tp, pp, dp, cp and ep."""

    tp_size = _getter("tp", "world_size")
    tp_rank = _getter("tp", "rank")
    tp_group = _getter("tp", "group")
    pp_size = _getter("pp", "world_size")
    pp_rank = _getter("pp", "rank")
    pp_group = _getter("pp", "group")
    dp_size = _getter("dp", "world_size")
    dp_rank = _getter("dp", "rank")
    dp_group = _getter("dp", "group")
    cp_size = _getter("cp", "world_size")
    cp_rank = _getter("cp", "rank")
    cp_group = _getter("cp", "group")
    ep_size = _getter("ep", "world_size")
    ep_rank = _getter("ep", "rank")
    ep_group = _getter("ep", "group")

    @property
    def rank(self) -> int:
        """Global rank."""
        return dist.get_rank()

    @property
    def world_size(self) -> int:
        """Number of processes."""
        return dist.get_world_size()

    @property
    def is_last_stage(self) -> bool:
        """Whether this rank holds the last pipeline stage (the one that computes the loss)."""
        _require_initialized()
        return parallel_state.is_pipeline_last_stage(ignore_virtual=True)

    def coordinates(self) -> dict[str, int]:
        """``{"rank", "tp", "pp", "dp", "cp"}`` of this process (what the log-line prefix shows)."""
        return {"rank": self.rank, "tp": self.tp_rank, "pp": self.pp_rank,
                "dp": self.dp_rank, "cp": self.cp_rank}

    def parallel_summary(self) -> str:
        """One line: sizes of every axis, then this rank's coordinates.

        ``world 4 = tp 2 x pp 1 x cp 1 x dp 2 (ep 1) | rank 3: tp 1 pp 0 cp 0 dp 1 ep 0``
        """
        sizes = " x ".join(f"{axis} {getattr(self, axis + '_size')}"
                           for axis in ("tp", "pp", "cp", "dp"))
        ranks = " ".join(f"{axis} {getattr(self, axis + '_rank')}"
                         for axis in ("tp", "pp", "cp", "dp", "ep"))
        return f"world {self.world_size} = {sizes} (ep {self.ep_size}) | rank {self.rank}: {ranks}"

    def get_parallel_states(self) -> SimpleNamespace:
        """All fifteen ``(tp|pp|dp|cp|ep)_(size|rank|group)`` as one namespace (megatron-wrap's
        ``get_parallel_states``), e.g. to hand to a flow."""
        _require_initialized()
        return SimpleNamespace(**{f"{axis}_{what}": getattr(self, f"{axis}_{what}")
                                  for axis in _AXES for what in ("size", "rank", "group")})

    def format_parallel_states(self) -> str:
        """megatron-wrap's short form: ``(TP0/2 PP0/1 DP1/2 CP0/1 EP0/1)`` (rank/size)."""
        return "(" + " ".join(f"{axis.upper()}{getattr(self, axis + '_rank')}/"
                              f"{getattr(self, axis + '_size')}"
                              for axis in ("tp", "pp", "dp", "cp", "ep")) + ")"

"""Which context-parallel group a micro-batch uses, and the swap that installs it.

Under dynamic CP every packed micro-batch carries its own CP group in
``PackedSeqParams.cp_group`` (and its size in ``local_cp_size``). :func:`resolve_cp_group`
decides the group for one call; :func:`use_cp_group` points every CP consumer of a set of
modules at it for the duration of a ``with`` block and restores the static groups in a
``finally``, so an exception never leaves a module on the wrong group.

No megatron-core import here: MTP, the router and anything else can reuse the swap cheaply.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Iterable, Iterator, Sequence

# The module attributes through which megatron-core 0.16.1 modules read their CP group:
# ``pg_collection.cp`` (Attention -> RoPE, GPTModel) and ``cp_group`` (core attention, MTP
# layers and blocks, LanguageModule).
PG_COLLECTION_ATTR = "pg_collection"
CP_GROUP_ATTR = "cp_group"


class LocalOnlyCPGroup:
    """Stands in for a CP group of one rank when a micro-batch has ``local_cp_size == 1``.

    Answers ``size() == 1`` and ``rank() == 0`` (all RoPE and core attention ask), so every CP
    code path takes its no-communication branch. It is not a ``ProcessGroup``: any collective
    attempted on it fails loudly instead of silently talking to the static group.
    """

    def size(self) -> int:
        return 1

    def rank(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "LocalOnlyCPGroup()"


LOCAL_ONLY_CP_GROUP = LocalOnlyCPGroup()


def resolve_cp_group(packed_seq_params: Any, static_group: Any) -> Any:
    """The CP group one forward call must use.

    Args:
        packed_seq_params: the micro-batch's ``PackedSeqParams`` or None.
        static_group: the module's construction-time CP group (``pg_collection.cp``).

    Returns:
        ``packed_seq_params.cp_group`` when set; :data:`LOCAL_ONLY_CP_GROUP` when the
        micro-batch says ``local_cp_size == 1`` without a group (CP off for it); otherwise
        ``static_group``.

    Raises:
        ValueError: ``local_cp_size`` disagrees with the group's size, or is > 1 without a group.
    """
    if packed_seq_params is None:
        return static_group
    group = getattr(packed_seq_params, "cp_group", None)
    local_size = getattr(packed_seq_params, "local_cp_size", None)
    if group is not None:
        if local_size is not None and int(local_size) != group.size():
            raise ValueError(
                f"packed_seq_params.local_cp_size={int(local_size)} but its cp_group has "
                f"{group.size()} ranks"
            )
        return group
    if local_size is None:
        return static_group
    if int(local_size) == 1:
        return LOCAL_ONLY_CP_GROUP
    raise ValueError(
        f"packed_seq_params.local_cp_size={int(local_size)} needs packed_seq_params.cp_group"
    )


def carries_cp_group(packed_seq_params: Any) -> bool:
    """True when the micro-batch overrides the static CP group (group or local_cp_size set)."""
    return packed_seq_params is not None and (
        getattr(packed_seq_params, "cp_group", None) is not None
        or getattr(packed_seq_params, "local_cp_size", None) is not None
    )


@contextlib.contextmanager
def swap_attributes(assignments: Sequence[tuple[Any, str, Any]]) -> Iterator[None]:
    """Sets ``obj.name = value`` for each assignment and restores the old values in a finally.

    Restores in reverse order, including when a later assignment (or the body) raised.
    """
    saved: list[tuple[Any, str, Any]] = []
    try:
        for owner, name, value in assignments:
            saved.append((owner, name, getattr(owner, name)))
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, old in reversed(saved):
            setattr(owner, name, old)


def cp_assignments(module: Any, group: Any) -> list[tuple[Any, str, Any]]:
    """The attribute swaps that point ``module``'s CP group at ``group`` (see
    :func:`use_cp_group`)."""
    assignments = []
    pg_collection = getattr(module, PG_COLLECTION_ATTR, None)
    if pg_collection is not None and hasattr(pg_collection, "cp"):
        # A copy: the collection object is shared by every layer of the model.
        switched = copy.copy(pg_collection)
        switched.cp = group
        assignments.append((module, PG_COLLECTION_ATTR, switched))
    if hasattr(module, CP_GROUP_ATTR):
        assignments.append((module, CP_GROUP_ATTR, group))
    return assignments


@contextlib.contextmanager
def use_cp_group(modules: Iterable[Any], group: Any) -> Iterator[None]:
    """Points every listed module's CP group at ``group`` for the block, then restores it.

    For each module, ``pg_collection`` (if it has one with a ``cp`` field) is replaced by a
    shallow copy whose ``cp`` is ``group``, and a ``cp_group`` attribute (if any) is set to
    ``group``. Only the listed modules change; children are not walked.
    """
    assignments = [a for module in modules for a in cp_assignments(module, group)]
    with swap_attributes(assignments):
        yield

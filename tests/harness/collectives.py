"""Forbid torch.distributed collectives inside a test rank: a layer on a single-rank CP group
must not communicate at all, and a forbidden call both raises and is recorded (so a layer that
catches the error still fails the test)."""

import torch.distributed as dist

COLLECTIVES = ("all_to_all_single", "all_to_all", "all_gather", "all_gather_into_tensor",
               "all_reduce", "reduce_scatter_tensor", "broadcast", "send", "recv", "isend",
               "irecv")
"""Every point-to-point and collective call a CP layer could make (attention: all-gather and
ring send/recv; Mamba: all-to-all)."""


def forbid_collectives(calls: list[str]) -> None:
    """Replaces each of COLLECTIVES in this process by one that appends its name to ``calls``
    and raises. Only for rank processes that end with the test (nothing is restored)."""
    def make(name):
        def forbidden(*args, **kwargs):
            calls.append(name)
            raise RuntimeError(f"collective {name} called for a single-rank CP group")
        return forbidden

    for name in COLLECTIVES:
        setattr(dist, name, make(name))

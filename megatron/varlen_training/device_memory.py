"""Megatron-LM's device-memory reports, on CUDA: the memory line and the memory scalars.

- The line (Megatron-LM's ``report_memory``), on every rank of data-parallel rank 0::

      [Rank 0] (after 1 iterations) memory (MB) | allocated: 812.41 | max allocated: ...
      | reserved: ... | max reserved: ...

  (one line without a closing ``|``, as Megatron-LM's; with ``--log-device-memory-used`` also
  ``total device memory used``), printed when
  Megatron-LM's ``training_log`` prints it: with the iteration lines until one comes after the
  run's second iteration, and with ``--log-memory-interval N`` on the iteration lines of
  multiples of N (:class:`MemoryReports`).
- The scalars (``--log-memory-to-tensorboard``): the allocator's ``mem-reserved-bytes``,
  ``mem-allocated-bytes``, ``mem-max-allocated-bytes`` and ``mem-allocated-count`` in the
  record, so TensorBoard, wandb and the JSONL get them (:func:`memory_scalars`).

A CPU run has no allocator statistics: it prints no memory line, and the flags that ask for
memory are refused at start-up (logging_arguments.py), never answered with a made-up number.
"""

from __future__ import annotations

import torch

MEGABYTES = 1024.0 * 1024.0
# Megatron-LM's scalar names -> torch.cuda.memory_stats() keys.
MEMORY_SCALARS = {"mem-reserved-bytes": "reserved_bytes.all.current",
                  "mem-allocated-bytes": "allocated_bytes.all.current",
                  "mem-max-allocated-bytes": "allocated_bytes.all.peak",
                  "mem-allocated-count": "allocation.all.current"}


def memory_scalars() -> dict[str, int]:
    """The CUDA allocator's statistics under Megatron-LM's scalar names."""
    stats = torch.cuda.memory_stats()
    return {name: stats[key] for name, key in MEMORY_SCALARS.items()}


def memory_line(name: str, rank: int, device_memory_used: bool) -> str:
    """Megatron-LM's ``report_memory`` line (MB) of this process's CUDA device; ``name`` says
    when (``(after 3 iterations)``)."""
    parts = [f"[Rank {rank}] {name} memory (MB)",
             f"allocated: {torch.cuda.memory_allocated() / MEGABYTES:.2f}",
             f"max allocated: {torch.cuda.max_memory_allocated() / MEGABYTES:.2f}",
             f"reserved: {torch.cuda.memory_reserved() / MEGABYTES:.2f}",
             f"max reserved: {torch.cuda.max_memory_reserved() / MEGABYTES:.2f}"]
    if device_memory_used:
        parts.append(f"total device memory used: "
                     f"{torch.cuda.device_memory_used() / MEGABYTES:.2f}")
    return " | ".join(parts)


class MemoryReports:
    """When Megatron-LM's ``training_log`` prints the memory line.

    Args:
        log_interval: ``--log-interval`` (the iteration lines' spacing).
        memory_interval: ``--log-memory-interval`` (None: only the first lines).
        start_iteration: The iteration the run starts after (a resumed checkpoint's).
    """

    def __init__(self, log_interval: int, memory_interval: int | None, start_iteration: int):
        self.log_interval = log_interval
        self.memory_interval = memory_interval
        self.start_iteration = start_iteration
        self._first_lines = True  # Megatron-LM's report_memory_flag
        self._first_iteration = True
        # The last due() was one of the first reports, which Megatron-LM's theoretical memory
        # footprint lines accompany (theoretical_memory.py; on any device).
        self.with_footprint = False

    def due(self, iteration: int) -> bool:
        """Whether the memory line follows ``iteration``'s (call once per iteration)."""
        first, self._first_iteration = self._first_iteration, False
        self.with_footprint = False
        if not (first or iteration % self.log_interval == 0):
            return False  # no iteration line, no memory line
        if self._first_lines:
            # Megatron-LM reports until a line after the run's second iteration, so that one
            # report includes the optimizer state the first update allocated.
            self._first_lines = iteration <= self.start_iteration + 1
            self.with_footprint = True
            return True
        return self.memory_interval is not None and iteration % self.memory_interval == 0

"""Reads the samples of each iteration for a step-batch provider, in order, in this process or
with Megatron-LM's ``--num-workers`` DataLoader worker processes reading ahead.

A provider knows which dataset indices iteration ``i`` needs on this rank (``indices_of(i)``);
the reader returns those samples, exactly as ``[dataset[k] for k in indices_of(i)]`` would:
workers only move the reads ahead of the step (torch's DataLoader keeps the sampler's order),
never change them. Iterations must come in order to be read ahead; a jump (a resumed run's
first iteration, an evaluation) restarts the workers at the new iteration.
:meth:`SampleReader.close` stops the workers when the run ends: their queues hold named
semaphores, which a process leaving without finalizers (``os._exit``, as test ranks do) leaks.
A user error raised by a read in a worker (a row the chat template refuses) comes back as the
same one-line exception, not as DataLoader's re-raise, which writes the worker's traceback into
the message.

The workers are forked from the rank: they inherit its uncollected garbage too, and a collection
in a worker would finalize it there, in a process without the rank's threads (seen: a worker's
segmentation fault while collecting, in a 4-rank test whose earlier run had left its model's
objects as garbage). So the
rank freezes its objects while it forks them (``gc.freeze``, Python's advice for fork without
exec; O(1), unlike a collection): a worker only ever collects what it made itself, and the
rank, which unfreezes everything after the fork, collects its garbage as before.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Sequence

import torch

from megatron.varlen_training.read_agreement import READ_USER_ERRORS


def _each_sample(sample: dict) -> dict:
    """DataLoader's collate for one sample at a time: the sample itself."""
    return sample


class _FailedRead:
    """A worker's user error, returned as a sample: raised by :meth:`SampleReader.read`."""

    def __init__(self, error: Exception):
        self.error = error


class _ErrorsAsSamples(torch.utils.data.Dataset):
    """``dataset`` as workers read it: a user error is returned, not raised."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        try:
            return self.dataset[index]
        except READ_USER_ERRORS as err:
            return _FailedRead(err)


def _raise_failed(sample):
    if isinstance(sample, _FailedRead):
        raise sample.error
    return sample


class _IterationSampler(torch.utils.data.Sampler):
    """The indices of iterations ``first, first + 1, ...`` up to ``stop``, in order."""

    def __init__(self, indices_of: Callable[[int], Sequence[int]], first: int, stop: int):
        self._indices_of, self._first, self._stop = indices_of, first, stop

    def __iter__(self) -> Iterator[int]:
        for iteration in range(self._first, self._stop):
            yield from self._indices_of(iteration)


class SampleReader:
    """``read(iteration)``: this rank's samples of one iteration (module docstring).

    Args:
        dataset: Map-style dataset; ``dataset[k]`` is a sample dict.
        indices_of: Dataset indices this rank reads at an iteration, in order.
        num_iterations: Iterations the dataset holds (workers never read past them).
        num_workers: Worker processes reading ahead; 0 reads in this process.
    """

    def __init__(self, dataset, indices_of: Callable[[int], Sequence[int]],
                 num_iterations: int, num_workers: int = 0):
        self.dataset = dataset
        self._indices_of = indices_of
        self._num_iterations = num_iterations
        self._num_workers = num_workers
        self._stream: Iterator[dict] | None = None
        self._next_iteration = None

    def read(self, iteration: int) -> list[dict]:
        indices = list(self._indices_of(iteration))
        if self._num_workers == 0:
            return [self.dataset[k] for k in indices]
        if iteration != self._next_iteration:
            self._stream = self._start(iteration)
        self._next_iteration = iteration + 1
        return [_raise_failed(next(self._stream)) for _ in indices]

    def close(self) -> None:
        """Stops the worker processes, if any, and frees their queues (idempotent); a later
        ``read`` starts new ones."""
        # The DataLoader's iterator stops and joins its workers when its last reference goes.
        self._stream, self._next_iteration = None, None

    def _start(self, iteration: int) -> Iterator[dict]:
        self._stream = None  # the previous workers stop before new ones start
        loader = torch.utils.data.DataLoader(
            _ErrorsAsSamples(self.dataset), batch_size=None, collate_fn=_each_sample,
            sampler=_IterationSampler(self._indices_of, iteration, self._num_iterations),
            num_workers=self._num_workers)
        # The workers fork here: none collects what the rank holds (docstring). Everything is
        # unfrozen after, also what was frozen before: Python 3.12 starts with a frozen
        # generation (gc.get_freeze_count() > 0), so "unfreeze only if nothing was frozen"
        # left the rank's garbage frozen for good there (H100 run 6). A freeze only ever saves
        # collection time (megatron-core's CUDA graphs unfreeze unconditionally too).
        gc.freeze()
        try:
            return iter(loader)
        finally:
            gc.unfreeze()

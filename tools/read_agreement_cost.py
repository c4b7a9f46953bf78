"""What agreeing on read errors costs a step: the data path with and without it, side by side.

    python tools/read_agreement_cost.py [--ranks 2] [--rounds 41] [--samples 64] [--json F]

Every step whose reads can fail (SFT files, indexed data with --no-mmap-bin-files:
``read_agreement.reads_can_fail``; mock and memory-mapped indexed data skip it) reads its samples
through ``read_agreement.read_agreed``: one MIN all-reduce of one int64 over the world (whether
a rank failed, and which). This tool runs pretrain_gpt.py's
packed data path (``PackedBatchProvider.step_batches``: read, gather lengths, schedule,
reroute, pack) on ``--ranks`` gloo CPU ranks over an in-memory dataset, in alternating rounds
with the agreement and with the read called directly, and times the bare all-reduce alone. It
prints the medians (milliseconds per step) and the median of the rounds' differences. CPU/gloo
numbers: on NCCL the all-reduce is a device kernel plus the host sync the data path already
makes (it reads the gathered lengths on the host).
"""

from __future__ import annotations

if not __package__:  # run as `python tools/X.py`: the repository root on sys.path
    import _repo_root  # noqa: F401

import argparse
import json
import statistics
import time

MS = 1e3
GLOBAL_BATCH = 64
SEQ_LENGTH = 256
BUDGET = 512  # tokens per rank and micro-batch
ROUNDS = 41
TIMEOUT_S = 600


class _LengthsDataset:
    """``num`` samples of pseudo-random lengths in [16, SEQ_LENGTH] (a lognormal-ish spread)."""

    def __init__(self, num: int):
        import numpy as np

        self.lengths = np.random.default_rng(0).integers(16, SEQ_LENGTH + 1, size=num)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> dict:
        import numpy as np

        from megatron.varlen_training.datasets.sample import make_sample

        ids = np.arange(int(self.lengths[index]) + 1, dtype=np.int64) % 100
        return make_sample(ids, None, index, pad_id=0)


def _direct(read):
    return read()


def _time_rounds(rounds: int, samples: int) -> dict:
    """This rank's per-round times: the step with and without the agreement, and the bare
    all-reduce (ms)."""
    import torch
    from megatron.core import parallel_state as ps

    from megatron.varlen.packing import GlobalBatchPacker, PackingConfig
    from megatron.varlen_training import data, read_agreement

    ps.initialize_model_parallel()
    try:
        config = PackingConfig(scheduler="dp_balanced", max_seqlen_per_rank=BUDGET, pad_id=0)
        provider = data.PackedBatchProvider(_LengthsDataset(samples * (rounds + 1)), samples,
                                            GlobalBatchPacker(config))
        times = {"agreed": [], "direct": [], "all_reduce": []}
        for iteration in range(rounds + 1):  # round 0 warms up and is dropped
            for name, read in (("agreed", read_agreement.read_agreed), ("direct", _direct)):
                data.read_agreed = read
                torch.distributed.barrier()
                started = time.perf_counter()
                provider.step_batches(iteration)
                if iteration:
                    times[name].append((time.perf_counter() - started) * MS)
            torch.distributed.barrier()
            started = time.perf_counter()
            read_agreement.first_failed_read(None)  # what a good step adds
            if iteration:
                times["all_reduce"].append((time.perf_counter() - started) * MS)
        data.read_agreed = read_agreement.read_agreed
        return times
    finally:
        ps.destroy_model_parallel()


def measure(ranks: int, rounds: int, samples: int) -> dict:
    """Medians over rounds of rank 0's times (ms) and of the rounds' agreed - direct."""
    from tests.harness.multirank import run_distributed

    times = run_distributed(_time_rounds, ranks, args=(rounds, samples),
                            timeout_s=TIMEOUT_S)[0]
    differences = [a - d for a, d in zip(times["agreed"], times["direct"])]
    return {"ranks": ranks, "rounds": rounds, "samples_per_step": samples,
            "step_agreed_ms": statistics.median(times["agreed"]),
            "step_direct_ms": statistics.median(times["direct"]),
            "difference_ms": statistics.median(differences),
            "all_reduce_ms": statistics.median(times["all_reduce"])}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--samples", type=int, default=GLOBAL_BATCH,
                        help="samples per global batch")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)
    result = measure(args.ranks, args.rounds, args.samples)
    print(f"packed data path, {result['ranks']} gloo ranks, {result['samples_per_step']} "
          f"samples per step, median of {result['rounds']} rounds:")
    print(f"  with read agreement   {result['step_agreed_ms']:8.3f} ms")
    print(f"  read directly         {result['step_direct_ms']:8.3f} ms")
    print(f"  difference per round  {result['difference_ms']:8.3f} ms")
    print(f"  the all-reduce alone  {result['all_reduce_ms']:8.3f} ms")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=1)
    return result


if __name__ == "__main__":
    main()

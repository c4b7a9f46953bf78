"""pretrain_gpt.py with one operational failure injected into the save of one iteration:
``python save_fault_driver.py KIND RANK ITER -- ARGS``. Used by test_save_failures.py only.

KIND ``full-disk-shards``: on rank RANK, megatron-core's writer processes find the disk full
(every write raises ENOSPC) while they write iteration ITER's shards. KIND ``full-disk-after``:
the disk fills up on rank RANK right after megatron-core's part of the save (our RNG states,
run description and manifest cannot be written). KIND ``sigint-shards``: a Ctrl-C reaches rank
RANK's process group (main process and writers, as a terminal sends it) while the writers write
iteration ITER (that writer first notes in $SAVE_FAULT_NOTES how writers take SIGINT). KIND
``sigint-publish``: the Ctrl-C comes as rank 0 renames the finished checkpoint into place.

torch and megatron-core are imported inside the functions, as in pretrain_gpt.py: the first
save's 'spawn' helper runs this file again (tests/unit_tests/test_entry_point_imports.py).
"""

import builtins
import errno
import os
import signal
import sys
import time

import pretrain_gpt  # first: it silences warnings before megatron.core is imported

WRITE_MODES = set("wax+")


class _FullFile:
    """An open file on a full disk: every write raises ENOSPC, as the kernel reports it."""

    def __init__(self, handle):
        self._handle = handle

    def write(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._handle.close()

    def __getattr__(self, name):
        return getattr(self._handle, name)


def _fill_disk() -> None:
    """From now on, files opened for writing in this process accept no bytes."""
    real_open = builtins.open

    def full_open(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        return _FullFile(handle) if WRITE_MODES & set(mode) else handle

    builtins.open = full_open


CTRL_C_DELAY_S = 0.5  # lets the main process finish forking writers and wait for them


def _ctrl_c() -> None:
    os.killpg(os.getpgid(0), signal.SIGINT)


def _ctrl_c_from_last_writer(local_proc_idx: int, num_writers: int) -> None:
    """A Ctrl-C while the writers write. CPython loses a SIGINT that lands while the main
    process is inside os.fork's hooks, as it would a real Ctrl-C at that instant: the last
    writer sends it once the main process is waiting for the writers."""
    if local_proc_idx == num_writers - 1:
        time.sleep(CTRL_C_DELAY_S)
        _note_sigint_disposition()
        _ctrl_c()


def _note_sigint_disposition() -> None:
    """Writes how this writer would take a Ctrl-C to $SAVE_FAULT_NOTES: whether a writer
    prints its own traceback races with the main process stopping it, so the test checks
    the cause (writers ignore SIGINT) rather than the symptom."""
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    with open(os.environ["SAVE_FAULT_NOTES"], "w", encoding="utf-8") as notes:
        notes.write("ignored" if ignored else "raises KeyboardInterrupt")


def _in_writers(iteration: int, action) -> None:
    """Runs ``action(writer index, writer count)`` in megatron-core's writer processes of
    iteration ``iteration``."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    real = filesystem_async.FileSystemWriterAsync.write_preloaded_data
    real_multiproc = filesystem_async.FileSystemWriterAsync.write_preloaded_data_multiproc
    num_writers = []

    def write_preloaded_data_multiproc(transform_list, use_msc, rank, write_buckets, queue):
        num_writers[:] = [len(write_buckets)]
        return real_multiproc(transform_list, use_msc, rank, write_buckets, queue)

    def write_preloaded_data(transform_list, local_proc_idx, write_bucket, *args, **kwargs):
        if f"iter_{iteration:07d}" in str(write_bucket[0]):
            action(local_proc_idx, num_writers[0])
        return real(transform_list, local_proc_idx, write_bucket, *args, **kwargs)

    filesystem_async.FileSystemWriterAsync.write_preloaded_data_multiproc = staticmethod(
        write_preloaded_data_multiproc)

    filesystem_async.FileSystemWriterAsync.write_preloaded_data = staticmethod(
        write_preloaded_data)


def _after_megatron_core(iteration: int, action) -> None:
    from megatron.varlen_training.checkpoint import save as checkpoint_save

    real_save = checkpoint_save.dist_checkpointing.save

    class _Saver:
        @staticmethod
        def save(state, path, *strategies, **options):
            real_save(state, path, *strategies, **options)
            if state["iteration"] == iteration:
                action()

        def __getattr__(self, name):
            return getattr(real_module, name)

    real_module = checkpoint_save.dist_checkpointing
    checkpoint_save.dist_checkpointing = _Saver()


def _at_publish(iteration: int, action) -> None:
    from megatron.varlen_training.checkpoint import integrity as checkpoint_integrity

    real_publish = checkpoint_integrity.publish

    def publish(staging, final_dir):
        if final_dir.endswith(f"iter_{iteration:07d}"):
            action()
        real_publish(staging, final_dir)

    checkpoint_integrity.publish = publish


def main() -> None:
    kind, rank, iteration = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    argv = sys.argv[sys.argv.index("--") + 1:]
    if int(os.environ.get("RANK", "0")) == rank:
        if kind == "full-disk-shards":
            _in_writers(iteration, lambda *_: _fill_disk())
        elif kind == "full-disk-after":
            _after_megatron_core(iteration, _fill_disk)
        elif kind == "sigint-shards":
            _in_writers(iteration, _ctrl_c_from_last_writer)
        elif kind == "sigint-publish":
            _at_publish(iteration, _ctrl_c)
        else:
            raise SystemExit(f"unknown fault kind {kind!r}")
    pretrain_gpt.main(argv)


if __name__ == "__main__":  # dist_checkpointing spawns processes: keep the guard
    main()

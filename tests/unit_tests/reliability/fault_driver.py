"""pretrain_gpt.py with one fault injected: ``python fault_driver.py KIND RANK ITER -- ARGS``.

KIND ``step``: rank RANK SIGKILLs itself at the start of iteration ITER (mid-run, while its
peers are inside that step's collectives). KIND ``save``: rank RANK SIGKILLs itself inside the
save of iteration ITER, after megatron-core wrote its files but before the checkpoint is
published. Used by test_fault_injection.py only.
"""

import os
import signal
import sys

import pretrain_gpt  # first: it silences warnings before megatron.core is imported


def _die() -> None:
    print(f"fault_driver: rank {os.environ['RANK']} killed", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    kind, rank, iteration = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    argv = sys.argv[sys.argv.index("--") + 1:]
    # Here, not at the top, as in pretrain_gpt.py: the first save's 'spawn' helper runs this
    # file again (tests/unit_tests/test_entry_point_imports.py).
    from megatron.varlen_training import training
    from megatron.varlen_training.checkpoint import save as checkpoint_save

    mine = int(os.environ["RANK"]) == rank
    if kind == "step" and mine:
        real_step = training.train_step

        def train_step(args, state, step, **kwargs):
            if state.iteration + 1 == iteration:
                _die()
            return real_step(args, state, step, **kwargs)

        training.train_step = train_step
    if kind == "save" and mine:
        real_save = checkpoint_save.dist_checkpointing.save

        class _Saver:
            @staticmethod
            def save(state, path, *strategies, **options):
                real_save(state, path, *strategies, **options)
                if state["iteration"] == iteration:
                    _die()

            def __getattr__(self, name):
                return getattr(real_save_module, name)

        real_save_module = checkpoint_save.dist_checkpointing
        checkpoint_save.dist_checkpointing = _Saver()
    pretrain_gpt.main(argv)


if __name__ == "__main__":
    main()

"""Megatron checkpoint -> Hugging Face checkpoint directory (transformers loads it).

    python tools/export_hf.py --load CKPT_ROOT --save-hf OUT_DIR --hf-checkpoint ORIGINAL_HF_DIR

See megatron/varlen_training/hf/export_tool.py for the flags. Needs the package installed
(`bash scripts/setup_env.sh` installs it in editable mode).
"""

if not __package__:  # run as `python tools/X.py`: the repository root on sys.path
    import _repo_root  # noqa: F401

from megatron.varlen_training.warning_filters import silence_known_warnings

silence_known_warnings()  # before megatron.core is imported (it warns at import time)

from megatron.varlen_training.hf.export_tool import main  # noqa: E402

if __name__ == "__main__":  # dist_checkpointing spawns processes: keep the guard
    main()

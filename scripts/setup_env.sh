#!/usr/bin/env bash
# Creates/updates the project's virtual environment in .venv, idempotently.
# torch is pinned to the CPU build that lies on this kind of machine (torch==2.13.0); an
# unpinned torch would pull a multi-GB CUDA build. GPU users: set TORCH_SPEC (e.g. "torch")
# to keep their CUDA torch; the package metadata itself only asks for torch>=2.4.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
STAMP="$VENV/.setup-stamp"
want="$(cat pyproject.toml scripts/setup_env.sh | sha256sum | cut -d' ' -f1) $TORCH_SPEC"

# The repository's own dev packages (tools/, tests/: the scheduling tool code and the multi-rank
# harness) are importable in this environment, so `python tools/X.py` needs no sys.path edit;
# they are never part of the installed library (pyproject lists only megatron.*).
write_repo_root_pth() {
  local site
  site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  pwd > "$site/megatron_varlen_repo_root.pth"
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  write_repo_root_pth
  exit 0
fi
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet "$TORCH_SPEC"
"$VENV/bin/python" -m pip install --quiet -e ".[test,plots,hf,metrics,data,tokenizers]"
write_repo_root_pth
echo "$want" > "$STAMP"

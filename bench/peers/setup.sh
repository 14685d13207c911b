#!/usr/bin/env bash
# Build bench/peers/.venv: SGLang and vLLM (no dependency resolution), a CPU torch, and
# only the packages their cache modules import. Idempotent: a finished venv is kept
# unless FORCE=1. Needs only the Python package index (and this machine's local
# torch CPU wheel, which pip's configured find-links provides).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="$HERE/.venv"
PYTHON="${PYTHON:-python3}"
SGLANG_VERSION="${SGLANG_VERSION:-0.5.23}"
VLLM_VERSION="${VLLM_VERSION:-0.33.0}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
STAMP="$VENV/.peers-ready"
WANT="sglang=$SGLANG_VERSION vllm=$VLLM_VERSION torch=$TORCH_VERSION req=$(sha256sum "$HERE/requirements.txt" | cut -c1-16)"

if [[ "${FORCE:-0}" != 1 && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
    echo "peers venv ready: $WANT"
    exit 0
fi

[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

# 1. torch first, pinned and without dependencies, so no CUDA build (and none of the
#    nvidia-* wheels a CUDA build depends on) can come in; then refuse a CUDA build.
"${PIP[@]}" install --no-deps "torch==$TORCH_VERSION"
if ! "$VENV/bin/python" - <<'PY'
import sys
from importlib.metadata import requires, version
# a CUDA build of torch requires nvidia-*/cuda-* wheels; the CPU build does not
cuda = [r for r in (requires("torch") or []) if r.lower().startswith(("nvidia", "cuda", "triton"))]
print("torch", version("torch"), "cuda requirements:", cuda or "none")
sys.exit(1 if cuda else 0)
PY
then
    echo "setup.sh: torch==$TORCH_VERSION installed as a CUDA build; the peers need the CPU wheel" >&2
    echo "          (put torch-$TORCH_VERSION+cpu in pip's find-links, or set TORCH_VERSION)" >&2
    exit 1
fi
# torch's own (pure-Python) dependencies, resolved normally: torch is already satisfied.
"${PIP[@]}" install "torch==$TORCH_VERSION" filelock typing-extensions sympy networkx jinja2 fsspec

# 2. the peers themselves, without their (CUDA-heavy) dependency trees
"${PIP[@]}" install --no-deps "sglang==$SGLANG_VERSION" "vllm==$VLLM_VERSION"

# 3. what their cache modules import, pinned, without dependency resolution
"${PIP[@]}" install --no-deps -r "$HERE/requirements.txt"

# 4. radixkv itself, from this checkout (editable), for compare.py's side-by-side runs
"${PIP[@]}" install --no-deps -e "$HERE/../.."

# 5. check the imports the drivers use
PEERS_DIR="$HERE" "$VENV/bin/python" - <<'PY'
import os, sys, warnings
sys.path.insert(0, os.environ.get("PEERS_DIR", "."))
warnings.simplefilter("ignore")
import drive_vllm, drive_sglang
print("vllm:", drive_vllm.versions())
print("sglang:", drive_sglang.versions())
PY
echo "$WANT" > "$STAMP"
echo "peers venv ready: $WANT"

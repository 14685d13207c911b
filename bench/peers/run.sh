#!/usr/bin/env bash
# Build the peers' venv if needed, then replay through SGLang and vLLM one after the other.
#
#   bash bench/peers/run.sh                 # quick check: first 500 conversation requests, 187488 pages
#   bash bench/peers/run.sh --matrix        # both traces x {187488, 31248} pages, appended to bench/results/peers.jsonl
#   bash bench/peers/run.sh ARGS...         # ARGS passed to both drivers (see drive_*.py --help)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bash "$HERE/setup.sh" >&2
PY="$HERE/.venv/bin/python"
TRACES="${TRACES:-$(cd "$HERE/../../.." && pwd)/shared/traces}"   # shared/ beside the checkout

run_both() {
    for peer in sglang vllm; do
        "$PY" "$HERE/drive_$peer.py" "$@"
    done
}

if [[ "${1:-}" == "--matrix" ]]; then
    shift
    OUT="${OUT:-$HERE/../results/peers.jsonl}"
    for trace in mooncake_conversation mooncake_synthetic; do
        for blocks in 187488 31248; do
            run_both --trace "$TRACES/$trace.jsonl" --num-blocks "$blocks" --out "$OUT" "$@"
        done
    done
elif [[ $# -eq 0 ]]; then
    run_both --trace "$TRACES/mooncake_conversation.jsonl" --num-blocks 187488 --limit 500 --repeat 3
else
    run_both "$@"
fi

#!/usr/bin/env bash
# The built-in model's accuracy through `atomk31 serve` (issue 20): starts the server on the
# shipped weights with the given flags (the default kernels of the machine), waits for /health,
# runs `atomk31 eval` (25 instances a family, seed 0) into OUT_DIR/eval.json, stops the server.
#
#   bash benchmarks/engine/demo_eval.sh OUT_DIR [serve flags ...]
set -eu
out=$1
shift
port=${PORT:-8124}
mkdir -p "$out"
python3 -m atomk31.cli serve --port "$port" "$@" > "$out/server.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null || true' EXIT
health="import httpx, sys; sys.exit(httpx.get('http://127.0.0.1:$port/health').status_code != 200)"
for _ in $(seq 300); do
    python3 -c "$health" 2>/dev/null && break
    kill -0 "$server" 2>/dev/null || { echo "the server exited; see $out/server.log"; exit 1; }
    sleep 1
done
python3 -m atomk31.cli eval --base-url "http://127.0.0.1:$port/v1" --num-per-task 25 --seed 0 \
    --concurrency 8 --result-file "$out/eval.json"

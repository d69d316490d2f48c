#!/usr/bin/env bash
# `atomk31 bench serve` at several concurrencies against a server started here (issue 17):
# starts `atomk31 serve --model MODEL`, waits for /health, runs one benchmark per concurrency
# (prompts of $INPUT_LEN tokens, default 2048, generating $OUTPUT_LEN, default 256, with
# ignore_eos; 4 requests per slot, at least 8, after C warm-up requests that capture the
# concurrency's graph shapes) writing OUT_DIR/serve_c<C>.json, then stops the
# server ($PORT, default 8123). Extra arguments go to `atomk31 serve`
# (e.g. --online-quant-config '{"global_quant_config": "ptpc_fp8"}').
#
#   bash benchmarks/engine/serve_sweep.sh MODEL OUT_DIR [CONCURRENCIES] [serve flags ...]
set -eu
model=$1
out=$2
concurrencies=${3:-1,16,64}
shift $(( $# < 3 ? $# : 3 ))
port=${PORT:-8123}
input_len=${INPUT_LEN:-2048}
output_len=${OUTPUT_LEN:-256}
mkdir -p "$out"
python3 -m atomk31.cli serve --model "$model" --port "$port" "$@" > "$out/server.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null || true' EXIT
health="import httpx, sys; sys.exit(httpx.get('http://127.0.0.1:$port/health').status_code != 200)"
for _ in $(seq 900); do
    python3 -c "$health" 2>/dev/null && break
    kill -0 "$server" 2>/dev/null || { echo "the server exited; see $out/server.log"; exit 1; }
    sleep 1
done
for c in ${concurrencies//,/ }; do
    prompts=$(( c * 4 > 8 ? c * 4 : 8 ))
    python3 -m atomk31.cli bench serve --port "$port" --max-concurrency "$c" \
        --num-prompts "$prompts" --num-warmups "$c" --input-len "$input_len" --output-len "$output_len" --ignore-eos \
        --metric-percentiles 50,90,99 --disable-tqdm --result-file "$out/serve_c$c.json"
done

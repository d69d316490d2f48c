#!/usr/bin/env bash
# Runs a list of GPU steps on the lent H200 and packs their logs and result JSON into
# $OUT/round.tar.gz (the device tool returns at most 8 files, so everything travels as one).
#
#   bash benchmarks/device_round.sh STEPS_FILE [ROUND_NAME]
#
# STEPS_FILE: one step per line, "name timeout_seconds command ..."; '#' lines are skipped.
# Each command may write JSON into $RESULTS (benchmarks take `--out $RESULTS`).
# ROUND_NAME (default "round") names the archive, so that two rounds can run side by side
# (for example the kernel tests beside the engine tests) and come back as separate files.
set -u
export PYTHONUNBUFFERED=1
round_name=${2:-round}
export RESULTS=/tmp/$round_name  # packed into $OUT at the end
mkdir -p "$RESULTS"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw \
    --format=csv > "$RESULTS/nvidia_smi.txt" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" \
    > "$RESULTS/versions.txt" 2>&1
summary="$RESULTS/summary.txt"
: > "$summary"
while read -r name limit command; do
    [[ -z "$name" || "$name" == \#* ]] && continue
    start=$(date +%s)
    timeout -k 15 "$limit" bash -c "$command" > "$RESULTS/$name.log" 2>&1
    rc=$?
    echo "=== $name rc=$rc $(( $(date +%s) - start ))s" | tee -a "$summary"
    # The last lines of a step are its table (benchmarks) or its pytest summary.
    tail -n "${TAIL_LINES:-14}" "$RESULTS/$name.log" | cut -c1-220 | tee -a "$summary"
done < "$1"
tar -czf "$OUT/$round_name.tar.gz" -C /tmp "$round_name"
cp "$summary" "$OUT/${round_name}_summary.txt"

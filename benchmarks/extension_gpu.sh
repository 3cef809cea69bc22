#!/usr/bin/env bash
# SmolLM2-135M past its own L = 8192 on one GPU: perplexity at L, 2L and 4L on both corpora, and the
# needle tasks (passkey, multi-key, variable tracking) at 4L, 1.5L and within L, each a plain
# `posenc bench --model` command (resumable: rerun the script to continue).
#
#     bash benchmarks/extension_gpu.sh OUT [SECONDS]
#     POSENC_MODEL=./ckpt POSENC_L=128 POSENC_DEVICE=cpu bash benchmarks/extension_gpu.sh /tmp/x   # a quick try
#
# Two lanes of commands share the GPU (one runs while the other waits on its CPU side); each lane
# runs its commands in order of importance and stops starting new ones after SECONDS (default:
# no limit), so a time-limited run keeps whole rows. Every command's log is OUT/<run>.log.
set -u
OUT=${1:?usage: extension_gpu.sh OUT [SECONDS]}
LIMIT=${2:-0}
DEVICE=${POSENC_DEVICE:-cuda}
MODEL=${POSENC_MODEL:-smollm2-135m}
L=${POSENC_L:-8192}  # another L than the checkpoint's own: --trained-length (a demonstration)
PY=${PYTHON:-python3}
mkdir -p "$OUT"
START=$(date +%s)

common=(--model "$MODEL" --preset standard --device "$DEVICE" --threads 2 --resume --no-progress --no-install)
[ "$L" = 8192 ] || common+=(--trained-length "$L")
tasks=(--tasks passkey multikey vartrack --passkey-depths 0.25 0.75 --passkey-examples 1
       --scalings yarn ntk --methods self_extend dual_chunk rerope --raised-base 0)

run() {  # run NAME ARGS...: one bench command unless the lane's time is up
  local name=$1; shift
  if [ "$LIMIT" -gt 0 ] && [ $(( $(date +%s) - START )) -ge "$LIMIT" ]; then
    echo "skipped $name: past ${LIMIT} s" >>"$OUT/$name.log"; return
  fi
  local t0=$(date +%s)
  if [ "$LIMIT" -gt 0 ]; then
    timeout $(( LIMIT - (t0 - START) + 60 )) "$PY" -m posenc bench "${common[@]}" "$@" --out "$OUT/$name" >"$OUT/$name.log" 2>&1
  else
    "$PY" -m posenc bench "${common[@]}" "$@" --out "$OUT/$name" >"$OUT/$name.log" 2>&1
  fi
  echo "$name: exit $? after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/lanes.log"
}

lane_lm() {
  run lm_code --tasks lm --corpus code --lm-eval-factors 1 2 4 --lm-eval-tokens $((4 * L))
  run lm_prose --tasks lm --corpus prose --lm-eval-factors 1 2 4 --lm-eval-tokens $((4 * L))
  run tasks_1.5L_s0 "${tasks[@]}" --passkey-eval-factors 1 1.5 --eval-seed 0
  run tasks_1.5L_s1 "${tasks[@]}" --passkey-eval-factors 1 1.5 --eval-seed 1
}

lane_tasks() {
  run tasks_4L_s0 "${tasks[@]}" --passkey-eval-factors 4 --eval-seed 0
  run tasks_4L_s1 "${tasks[@]}" --passkey-eval-factors 4 --eval-seed 1
  run tasks_4L_s2 "${tasks[@]}" --passkey-eval-factors 4 --eval-seed 2
}

{ uptime; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null; } >"$OUT/machine.txt"
lane_lm & a=$!
lane_tasks & b=$!
wait $a $b
uptime >>"$OUT/machine.txt"
echo "both lanes done after $(( $(date +%s) - START )) s" | tee -a "$OUT/lanes.log"

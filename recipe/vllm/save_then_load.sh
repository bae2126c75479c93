#!/usr/bin/env bash
# vLLM + Foundry on one GPU: a SAVE start, then a LOAD start in a fresh process, and (optionally)
# an unmodified start, with identical greedy completions checked between them.
#
# Usage: bash recipe/vllm/save_then_load.sh [llm|serve] [MODEL_DIR] [ARCHIVE_DIR]
#   llm    the offline LLM API (FOUNDRY_ARCHIVE / FOUNDRY_MODE in the environment)   [default]
#   serve  `vllm serve MODEL --foundry-archive DIR --foundry-mode ...` and /v1/completions
#   MODEL_DIR    default /tmp/tiny-qwen3 (written with tiny_model.py when missing, with random
#                weights; a folder without *.safetensors runs on dummy weights)
#   ARCHIVE_DIR  default /tmp/foundry-vllm-archive (removed first: the first start SAVEs)
# Env: BASELINE=1 adds a start without Foundry (FOUNDRY_MODE=off) to the comparison;
#      SIZES (default "1 2 4 8 16 32 64 128") capture sizes; MAX_MODEL_LEN (2048); PORT (8011);
#      TP (1): tensor parallel size (NCCL all-reduce, custom all-reduce off; one archive per rank);
#      DP (1): data parallel size of the serve starts (independent replicas; one archive per rank);
#      EP=1: --enable-expert-parallel (a mixture-of-experts model; with DP, its replicas share one
#      world and exchange tokens through NCCL inside the graphs);
#      TPOT: batch sizes to time decode at (e.g. 1,8,32,128; serve starts: over HTTP, serve_client.py,
#      with DP each replica on its own);
#      CG_MODE: vLLM's CUDA-graph mode (default: vLLM's, FULL_AND_PIECEWISE);
#      PYTHON (python3);
#      VLLM_ENV: a file to source first (the GPU machine's pack: /tmp/site/vllm-env.sh);
#      TINY_MODEL: tiny_model.py (default: the enginepack's); SERVE_TIMEOUT (600 s);
#      WEIGHTS=dummy: a model folder without weights keeps the engine's dummy ones (by default
#      recipe/random_weights.py writes random ones first; it refuses models over 1e9 parameters).
# Output: OUT_DIR (default /tmp/foundry-vllm-recipe) holds one log and one JSON per start.
set -euo pipefail
WHAT="${1:-llm}"
case "$WHAT" in
  -h|--help) sed -n '2,/^# Output/p' "$0"; exit 0 ;;
  llm|serve) ;;
  *) echo "usage: $0 [llm|serve] [MODEL_DIR] [ARCHIVE_DIR] (got '$WHAT')" >&2; exit 2 ;;
esac
MODEL="${2:-/tmp/tiny-qwen3}"
ARCHIVE="${3:-/tmp/foundry-vllm-archive}"
SIZES="${SIZES:-1 2 4 8 16 32 64 128}"
PORT="${PORT:-8011}"
MAX_MODEL_LEN="${MAX_MODEL_LEN:-2048}"
PYTHON="${PYTHON:-python3}"
OUT="${OUT_DIR:-/tmp/foundry-vllm-recipe}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=recipe/lib.sh
source "$HERE/../lib.sh"
if [ -n "${VLLM_ENV:-}" ]; then
  # shellcheck disable=SC1090
  source "$VLLM_ENV"
fi
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER="${VLLM_USE_FLASHINFER_SAMPLER:-0}"
mkdir -p "$OUT"
RANKS=$(( ${TP:-1} * ${DP:-1} ))
if [ "${DP:-1}" != 1 ] && [ "$WHAT" = llm ]; then
  echo "DP applies to serve starts only (vLLM's offline LLM API runs one replica per process)" >&2; exit 2
fi
CG_MODE="${CG_MODE:-}"
PARALLEL=()
[ "${TP:-1}" = 1 ] || PARALLEL+=( --tensor-parallel-size "$TP" --disable-custom-all-reduce )
[ "${DP:-1}" = 1 ] || PARALLEL+=( --data-parallel-size "$DP" )
[ "${EP:-0}" = 1 ] && PARALLEL+=( --enable-expert-parallel )

ensure_tiny_model "$MODEL"
rm -rf "$ARCHIVE"

# ---- offline LLM API ----------------------------------------------------------------------------
run_llm() {  # NAME FOUNDRY_MODE
  echo "=== $1: LLM(...) with FOUNDRY_MODE=$2"
  FOUNDRY_ARCHIVE="$ARCHIVE" FOUNDRY_MODE="$2" "$PYTHON" "$HERE/start.py" "$MODEL" "$OUT/$1.json" \
    --sizes "$SIZES" --max-model-len "$MAX_MODEL_LEN" --tp "${TP:-1}" --tpot "${TPOT:-}" --cudagraph-mode "$CG_MODE" \
    $([ "${EP:-0}" = 1 ] && echo --ep) > "$OUT/$1.log" 2>&1 \
    || { tail -n 60 "$OUT/$1.log"; exit 1; }
  grep -E "foundry|ready |Graph capturing finished|init engine" "$OUT/$1.log" || true
}

# ---- vllm serve ---------------------------------------------------------------------------------
run_serve() {  # NAME FOUNDRY_MODE
  echo "=== $1: vllm serve with --foundry-mode $2"
  local t0 pid rc=0
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086
  "$PYTHON" -m vllm.entrypoints.cli.main serve "$MODEL" --load-format "$(load_format "$MODEL")" --attention-backend FLASH_ATTN \
    --served-model-name tiny --max-model-len "$MAX_MODEL_LEN" --gpu-memory-utilization 0.5 --seed 0 \
    ${CG_MODE:+-cc.cudagraph_mode=$CG_MODE} --cudagraph-capture-sizes $SIZES ${PARALLEL[@]+"${PARALLEL[@]}"} \
    --foundry-archive "$ARCHIVE" --foundry-mode "$2" --host 127.0.0.1 --port "$PORT" > "$OUT/$1.log" 2>&1 &
  pid=$!
  run_when_healthy "$PORT" "${SERVE_TIMEOUT:-600}" "$pid" "$t0" "vllm serve exited before /health answered" \
    "timed out waiting for /health" "$PORT" "$OUT/$1.json" "${TPOT:-}" "${DP:-1}" < "$HERE/serve_client.py" || rc=$?
  kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true
  grep -E "foundry|Graph capturing finished" "$OUT/$1.log" || true
  [ "$rc" = 0 ] || { tail -n 60 "$OUT/$1.log"; exit "$rc"; }
}

case "$WHAT" in
  llm) run=run_llm ;;
  serve) run=run_serve ;;
  *) echo "usage: $0 [llm|serve] [MODEL_DIR] [ARCHIVE_DIR]" >&2; exit 2 ;;
esac
names=()
if [ "${BASELINE:-0}" = 1 ]; then $run baseline off; names+=(baseline); fi
$run save save; names+=(save)
# A start that fell back would still produce identical tokens: check each did what it was asked.
expect_saved "\[foundry\] saved [0-9]+ graphs \("
$run load load; names+=(load)
expect_restored "foundry: restored [0-9]+ graphs"
# Every global rank (tensor x data parallel) saved and restored its own archive, rank<N>/: a count
# of log lines would not tell two replicas sharing one rank's archive from one each.
for ((r = 0; r < RANKS; r++)); do
  [ -f "$ARCHIVE/rank$r/engine_state.json" ] || { echo "no complete archive for rank $r in $ARCHIVE" >&2; exit 1; }
  expect_log "$OUT/load.log" "foundry: rank $r restored [0-9]+ graphs from " \
    "the LOAD start did not restore rank $r's graphs (see $OUT/load.log)"
done

compare_tokens "outputs differ from {ref}: {bad}" \
  "identical {what} ({count} prompts, {distinct} distinct completions) across {names}" "${names[@]}"

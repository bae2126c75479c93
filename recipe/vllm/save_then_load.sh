#!/usr/bin/env bash
# vLLM + Foundry on one GPU: a SAVE start, then a LOAD start in a fresh process, and (optionally)
# an unmodified start, with identical greedy completions checked between them.
#
# Usage: bash recipe/vllm/save_then_load.sh [llm|serve] [MODEL_DIR] [ARCHIVE_DIR]
#   llm    the offline LLM API (FOUNDRY_ARCHIVE / FOUNDRY_MODE in the environment)   [default]
#   serve  `vllm serve MODEL --foundry-archive DIR --foundry-mode ...` and /v1/completions
#   MODEL_DIR    default /tmp/tiny-qwen3 (written with tiny_model.py when missing; dummy weights)
#   ARCHIVE_DIR  default /tmp/foundry-vllm-archive (removed first: the first start SAVEs)
# Env: BASELINE=1 adds a start without Foundry (FOUNDRY_MODE=off) to the comparison;
#      SIZES (default "1 2 4 8 16 32 64 128") capture sizes; MAX_MODEL_LEN (2048); PORT (8011);
#      PYTHON (python3);
#      VLLM_ENV: a file to source first (the GPU machine's pack: /tmp/site/vllm-env.sh);
#      TINY_MODEL: tiny_model.py (default: the enginepack's); SERVE_TIMEOUT (600 s).
# Output: OUT_DIR (default /tmp/foundry-vllm-recipe) holds one log and one JSON per start.
set -euo pipefail
WHAT="${1:-llm}"
MODEL="${2:-/tmp/tiny-qwen3}"
ARCHIVE="${3:-/tmp/foundry-vllm-archive}"
SIZES="${SIZES:-1 2 4 8 16 32 64 128}"
PORT="${PORT:-8011}"
MAX_MODEL_LEN="${MAX_MODEL_LEN:-2048}"
PYTHON="${PYTHON:-python3}"
OUT="${OUT_DIR:-/tmp/foundry-vllm-recipe}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ -n "${VLLM_ENV:-}" ]; then
  # shellcheck disable=SC1090
  source "$VLLM_ENV"
fi
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER="${VLLM_USE_FLASHINFER_SAMPLER:-0}"
mkdir -p "$OUT"

if [ ! -f "$MODEL/config.json" ]; then
  gen="${TINY_MODEL:-}"
  for cand in "$HERE/../../shared/tools/enginepack/tiny_model.py" "$HERE/../../../shared/tools/enginepack/tiny_model.py"; do
    [ -n "$gen" ] || { [ -f "$cand" ] && gen="$cand"; }
  done
  [ -n "$gen" ] || { echo "tiny_model.py not found; set TINY_MODEL" >&2; exit 1; }
  "$PYTHON" "$gen" "$MODEL"
fi
rm -rf "$ARCHIVE"

# ---- offline LLM API ----------------------------------------------------------------------------
run_llm() {  # NAME FOUNDRY_MODE
  echo "=== $1: LLM(...) with FOUNDRY_MODE=$2"
  FOUNDRY_ARCHIVE="$ARCHIVE" FOUNDRY_MODE="$2" "$PYTHON" "$HERE/start.py" "$MODEL" "$OUT/$1.json" \
    --sizes "$SIZES" --max-model-len "$MAX_MODEL_LEN" > "$OUT/$1.log" 2>&1 || { tail -n 60 "$OUT/$1.log"; exit 1; }
  grep -E "foundry|ready |Graph capturing finished|init engine" "$OUT/$1.log" || true
}

# ---- vllm serve ---------------------------------------------------------------------------------
run_serve() {  # NAME FOUNDRY_MODE
  echo "=== $1: vllm serve with --foundry-mode $2"
  local t0 pid rc=0
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086
  "$PYTHON" -m vllm.entrypoints.cli.main serve "$MODEL" --load-format dummy --attention-backend FLASH_ATTN \
    --served-model-name tiny --max-model-len "$MAX_MODEL_LEN" --gpu-memory-utilization 0.5 --seed 0 \
    -cc.cudagraph_mode=FULL_DECODE_ONLY --cudagraph-capture-sizes $SIZES \
    --foundry-archive "$ARCHIVE" --foundry-mode "$2" --host 127.0.0.1 --port "$PORT" > "$OUT/$1.log" 2>&1 &
  pid=$!
  "$PYTHON" - "$PORT" "${SERVE_TIMEOUT:-600}" "$pid" "$t0" "$OUT/$1.json" <<'EOF' || rc=$?
import json, os, sys, time, urllib.request
port, limit, pid, t0, out = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
base = f"http://127.0.0.1:{port}"
while True:
    try:
        with urllib.request.urlopen(base + "/health", timeout=2) as r:
            if r.status == 200:
                break
    except Exception:
        pass
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit("vllm serve exited before /health answered")
    if time.time() - t0 > limit:
        sys.exit("timed out waiting for /health")
    time.sleep(0.2)
ready = time.time() - t0
tokens = []
for i in range(32):
    body = {"model": "tiny", "prompt": f"hello world the model number {i} said", "max_tokens": 64,
            "temperature": 0.0, "ignore_eos": True, "return_token_ids": True}
    req = urllib.request.Request(base + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        choice = json.load(r)["choices"][0]
    tokens.append(choice.get("token_ids") or choice["text"])
json.dump({"ready_s": ready, "tokens": tokens}, open(out, "w"))
print(f"/health 200 after {ready:.1f} s")
EOF
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
grep -qE "foundry: .*saved [0-9]+ graphs" "$OUT/save.log" || { echo "the SAVE start wrote no archive (see $OUT/save.log)" >&2; exit 1; }
$run load load; names+=(load)
grep -qE "foundry: restored [0-9]+ graphs" "$OUT/load.log" || { echo "the LOAD start restored no graphs (see $OUT/load.log)" >&2; exit 1; }

"$PYTHON" - "$OUT" "${names[@]}" <<'EOF'
import json, sys
out, names = sys.argv[1], sys.argv[2:]
runs = {n: json.load(open(f"{out}/{n}.json")) for n in names}
for n, r in runs.items():
    print(f"{n:9s} ready {r['ready_s']:6.1f} s")
ref = runs[names[0]]["tokens"]
bad = [n for n in names[1:] if runs[n]["tokens"] != ref]
if bad:
    sys.exit(f"completions differ from {names[0]}: {', '.join(bad)}")
print(f"identical greedy completions ({len(ref)} prompts) across {', '.join(names)}")
EOF

#!/usr/bin/env bash
# SGLang + Foundry on one GPU: an unmodified start, a SAVE start, then a LOAD start, each a fresh
# `python -m sglang.launch_server`, with identical greedy tokens and log-probabilities checked across the three, and the
# SAVE / LOAD starts checked to have saved / restored (a start that fell back would still give
# identical tokens, so the `foundry:` log lines are the proof).
#
# Usage: bash recipe/sglang/save_then_load.sh [MODEL_DIR] [ARCHIVE_DIR]
#   MODEL_DIR    default /tmp/tiny-qwen3 (written with tiny_model.py when missing, with random
#                weights; a folder without *.safetensors runs on dummy weights)
#   ARCHIVE_DIR  default /tmp/foundry-sglang-archive (removed first: the SAVE start writes it)
# Env: SIZES (default "1 2 4 8 16 32") decode CUDA-graph batch sizes, "default" for SGLang's own;
#      CONTEXT_LENGTH (2048); MAX_RUNNING (32, "default" for SGLang's own); MEM_FRACTION (0.5);
#      PORT (30011); PROMPTS (32); TOKENS (64);
#      PREFILL_GRAPHS=0: --disable-prefill-cuda-graph (default: SGLang's default prefill graphs,
#      saved and restored with the decode graphs);
#      LENGTHS (5,60,300,900,1700): prompt lengths in tokens, one request each after the batch (prefill
#      graphs are chosen by token count; each must fit CONTEXT_LENGTH with TOKENS);
#      BASELINE=0 skips the unmodified start; DISABLE_OVERLAP=1 (default) passes
#      --disable-overlap-schedule (one variable fewer for the first validation; 0 keeps SGLang's
#      default); SKIP_SERVER_WARMUP=1 passes --skip-server-warmup (same on every start);
#      EXTRA_ARGS: more launch_server flags, the same for every start; PYTHON (python3);
#      SGLANG_ENV: a file to source first (the GPU machine's pack: /tmp/site/sglang-env.sh);
#      FALLBACKS=1 adds a start on a corrupted copy of the archive (mode load) and one on a foreign
#      copy (another context length, mode auto): both must fall back with identical tokens;
#      TINY_MODEL: tiny_model.py (default: the enginepack's); START_TIMEOUT (900 s: the first start
#      JIT-compiles kernels); TPOT: batch sizes to time decode at (e.g. 1,8,32,128; each needs a
#      captured size at least as large and MAX_RUNNING at least as large), the median over 3 of
#      (a request of 65 tokens - one of 1 token) / 64, so the prefill and HTTP cost cancel;
#      TPOT_REPS (3): repetitions of that measurement (and of TTFT's); TTFT: prompt lengths in
#      tokens to time the first token at (e.g. 60,900,1700: the median of TPOT_REPS requests of
#      one output token, each prompt new to the prefix cache, each sent TTFT_GAP (0.1) s after the
#      previous answer: SGLang 0.5.17's overlap loop launches one more decode step of a request
#      before it sends that request's answer, and waits for that step before it reads the next
#      request, so a request sent at once may wait for it); TTFT_SETTLE: seconds after which
#      TTFT is timed again (new prompts of the same lengths), as ttft_settled_ms (the schedulers'
#      minor page faults per TTFT request, medians: ttft_faults, ttft_settled_faults); REPEAT (1):
#      after the checks, REPEAT-1 more pairs of an unmodified start (baseline-N, with BASELINE=1) and a LOAD start
#      (load-N), alternating, for TPOT over several starts (recipe/tpot_spread.py); LOAD_ONLY=1:
#      keep the archive and run the LOAD start alone (it must restore); BASELINE_ONLY=N: N
#      unmodified starts alone, their outputs compared with each other (the engine's own
#      repeatability); CPU_LIST: run every start's processes on these CPUs only (taskset -c,
#      e.g. the GPU's NUMA node from nvidia-smi topo -m), so that starts compared for TPOT do not
#      differ in where the host placed them; STEP_LOG=1:
#      SGLang logs every decode step (--decode-log-interval 1) and each start's JSON also gets
#      step_tpot_ms, the scheduler's own step time per batch size (step_tpot.py);
#      ALSO_INSTANTIATE=MODE adds to each REPEAT round a LOAD start with
#      FOUNDRY_SGLANG_INSTANTIATE=MODE (load-MODE-N); ALSO_ENV=NAME=VALUE adds one with that
#      variable (load-env-N, e.g. FOUNDRY_FORK_PRIVATE_HEAP=1); WEIGHTS=dummy: a model folder without
#      weights keeps the engine's dummy ones (by default recipe/random_weights.py writes random
#      ones first; it refuses models over 1e9 parameters).
# Output: OUT_DIR (default /tmp/foundry-sglang-recipe) holds one log and one JSON per start.
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,/^# Output/p' "$0"; exit 0 ;;
  -*) echo "usage: $0 [MODEL_DIR] [ARCHIVE_DIR] (unknown option '$1')" >&2; exit 2 ;;
esac
MODEL="${1:-/tmp/tiny-qwen3}"
ARCHIVE="${2:-/tmp/foundry-sglang-archive}"
SIZES="${SIZES:-1 2 4 8 16 32}"
CONTEXT_LENGTH="${CONTEXT_LENGTH:-2048}"
MAX_RUNNING="${MAX_RUNNING:-32}"
MEM_FRACTION="${MEM_FRACTION:-0.5}"
PORT="${PORT:-30011}"
PROMPTS="${PROMPTS:-32}"
TOKENS="${TOKENS:-64}"
PYTHON="${PYTHON:-python3}"
OUT="${OUT_DIR:-/tmp/foundry-sglang-recipe}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=recipe/lib.sh
source "$HERE/../lib.sh"
if [ -n "${SGLANG_ENV:-}" ]; then
  # shellcheck disable=SC1090
  source "$SGLANG_ENV"
fi
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"

ensure_tiny_model "$MODEL"
[ "${LOAD_ONLY:-0}" = 1 ] || rm -rf "$ARCHIVE"

# The same flags on every start: anything that shapes the graphs is part of the archive's
# fingerprint, and a LOAD with other flags falls back (which this script reports as a failure).
# shellcheck disable=SC2206
FLAGS=( --model-path "$MODEL" --load-format "$(load_format "$MODEL")" --attention-backend triton --sampling-backend pytorch
        --disable-flashinfer-autotune --mem-fraction-static "$MEM_FRACTION" --context-length "$CONTEXT_LENGTH"
        --random-seed 0 --served-model-name tiny --host 127.0.0.1 --port "$PORT" )
[ "$SIZES" = default ] || FLAGS+=( --cuda-graph-bs-decode $SIZES )
[ "$MAX_RUNNING" = default ] || FLAGS+=( --max-running-requests "$MAX_RUNNING" )
# What a LOAD start logs when it restored the graphs (with prefill graphs on: both kinds).
RESTORED="foundry: restored [0-9]+ decode graphs in "
if [ "${PREFILL_GRAPHS:-1}" = 1 ]; then
  RESTORED="foundry: restored [0-9]+ decode graphs and [0-9]+ prefill graphs in "
else
  FLAGS+=( --disable-prefill-cuda-graph )
fi
[ "${DISABLE_OVERLAP:-1}" = 1 ] && FLAGS+=( --disable-overlap-schedule )
[ "${SKIP_SERVER_WARMUP:-0}" = 1 ] && FLAGS+=( --skip-server-warmup )
[ "${STEP_LOG:-0}" = 1 ] && FLAGS+=( --decode-log-interval 1 )
# shellcheck disable=SC2206
[ -n "${EXTRA_ARGS:-}" ] && FLAGS+=( ${EXTRA_ARGS} )

PIN=()
[ -z "${CPU_LIST:-}" ] || PIN=( taskset -c "$CPU_LIST" )

SERVER_PGID=""
stop_server() {  # the server and every process it spawned (its own process group)
  [ -n "$SERVER_PGID" ] || return 0
  kill -TERM -- "-$SERVER_PGID" 2>/dev/null || true
  for _ in $(seq 1 60); do kill -0 -- "-$SERVER_PGID" 2>/dev/null || break; sleep 0.5; done
  kill -KILL -- "-$SERVER_PGID" 2>/dev/null || true
  SERVER_PGID=""
}
trap stop_server EXIT

run() {  # NAME [foundry flags...]: one start, its /health time and greedy tokens in $OUT/NAME.json
  local name="$1"; shift
  echo "=== $name: python -m sglang.launch_server ... $*"
  local t0 rc=0
  t0=$(date +%s.%N)
  # setsid: the server leads its own process group, so stop_server reaches its schedulers too.
  env -u FOUNDRY_ARCHIVE -u FOUNDRY_MODE setsid "${PIN[@]}" "$PYTHON" -m sglang.launch_server "${FLAGS[@]}" "$@" \
    > "$OUT/$name.log" 2>&1 &
  SERVER_PGID=$!
  run_when_healthy "$PORT" "${START_TIMEOUT:-900}" "$SERVER_PGID" "$t0" \
    "sglang.launch_server exited before /health answered" "timed out after {limit:.0f} s waiting for /health" \
    "$PORT" "$OUT/$name.json" "$PROMPTS" "$TOKENS" "${TPOT:-}" "${TPOT_REPS:-3}" "${LENGTHS-5,60,300,900,1700}" \
    "${TTFT:-}" \
    <<'EOF' || rc=$?
import json, os, statistics, sys, time, urllib.request
port, out, prompts, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
tpot_batches, reps = [int(b) for b in sys.argv[5].split(",") if b.strip()], int(sys.argv[6])
lengths = [int(n) for n in sys.argv[7].split(",") if n.strip()]
ttft_lengths, ready = [int(n) for n in sys.argv[8].split(",") if n.strip()], float(sys.argv[9])
base = f"http://127.0.0.1:{port}"

def post(path, body):
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.load(r)

def generate(texts, max_new_tokens=tokens, logprobs=False, key="text"):
    return post("/generate", {key: texts, "return_logprob": logprobs,
                              "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True}})

# One batched request (decode batches up to the largest graph), then one prompt alone (batch 1).
texts = [f"hello world the model number {' '.join(str(i))} said" for i in range(prompts)]  # 0-9 are words, "12" is not
# Sent as token ids, SGLang hands the batch to the scheduler as one message, so every start
# prefills it in the same batches; sent as text, each prompt goes on its own and the split of the
# prefill batches follows their arrival, which changes the numerics from the first token on.
ids_in = post("/tokenize", {"model": "tiny", "prompt": texts})["tokens"]
# Each chosen token's log-probability too: SGLang computes it from the logits the graphs wrote.
batched = generate(ids_in, logprobs=True, key="input_ids")
single = generate(ids_in[0], logprobs=True, key="input_ids")
runs = [*batched, single] if isinstance(batched, list) else [batched, single]
# Then one prompt of each length alone (fixed token ids): each prefill takes the graph of its token count.
runs += [generate([(7 * i) % 997 + 100 for i in range(n)], logprobs=True, key="input_ids") for n in lengths]
ids = [r["output_ids"] for r in runs]
logprobs = [[lp for lp, *_ in r["meta_info"]["output_token_logprobs"]] for r in runs]
assert all(len(x) == tokens for x in ids), [len(x) for x in ids]

def tpot_samples_ms(batch, steps=64):
    texts = [f"hello world the model number {i + 1000} said" for i in range(batch)]
    def timed(n):
        start = time.perf_counter()
        generate(texts, n)
        return time.perf_counter() - start
    timed(steps + 1)  # first use of this batch size
    return [(timed(steps + 1) - timed(1)) / steps * 1e3 for _ in range(reps)]

def scheduler_faults():
    # Minor page faults of the schedulers so far (None: none found): a scheduler forked from a
    # process that imported SGLang shares its pages until it writes to them. SGLang names them
    # sglang::scheduler* (the command line, or the 15 characters of the thread name).
    total, found = 0, 0
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f, open(f"/proc/{pid}/comm", "rb") as c:
                if not (f.read().startswith(b"sglang::scheduler") or c.read().startswith(b"sglang::schedul")):
                    continue
            with open(f"/proc/{pid}/stat") as f:
                total += int(f.read().rpartition(")")[2].split()[7])
            found += 1
        except (OSError, ValueError, IndexError):
            continue
    return total if found else None

def ttft_samples_ms(n, first=0, faults=None):
    # A first token alone: the prefill of n tokens, its sampling, and the HTTP round trip. The
    # first token of each prompt is its own (from `first` on), so SGLang's prefix cache never
    # serves a prefill. `faults` gets each request's scheduler page faults.
    def timed(r):
        prompt = [20000 + 50 * n + first + r] + [(7 * i) % 997 + 100 for i in range(n - 1)]
        time.sleep(ttft_gap)  # the scheduler idle, as for a user's lone request
        before = scheduler_faults()
        start = time.perf_counter()
        generate([prompt], 1, key="input_ids")
        ms = (time.perf_counter() - start) * 1e3
        after = scheduler_faults()
        if faults is not None and r and None not in (before, after):
            faults.append(after - before)
        return ms
    timed(0)  # first use of this token count
    return [timed(r + 1) for r in range(reps)]

def ttft_run(first=0):
    samples, faults = {}, {}
    for n in ttft_lengths:
        faults[str(n)] = []
        samples[str(n)] = ttft_samples_ms(n, first, faults[str(n)])
    return samples, {n: statistics.median(f) for n, f in faults.items() if f}

samples = {str(b): tpot_samples_ms(b) for b in tpot_batches}
tpot = {b: statistics.median(s) for b, s in samples.items()}
ttft_gap = float(os.environ.get("TTFT_GAP") or 0.1)
ttft_samples, ttft_faults = ttft_run()
ttft = {n: statistics.median(s) for n, s in ttft_samples.items()}
result = {"ready_s": ready, "tokens": ids, "logprobs": logprobs, "tpot_ms": tpot, "tpot_samples_ms": samples,
          "ttft_ms": ttft, "ttft_samples_ms": ttft_samples, "ttft_faults": ttft_faults, "ttft_gap_s": ttft_gap}
settle = float(os.environ.get("TTFT_SETTLE") or 0)
if ttft_lengths and settle > 0:  # the same requests again once the server has served a while
    time.sleep(settle)
    later, later_faults = ttft_run(first=reps + 1)  # new prompts of the same lengths
    result.update(ttft_settled_ms={n: statistics.median(s) for n, s in later.items()}, ttft_settled_samples_ms=later,
                  ttft_settled_faults=later_faults, ttft_settle_s=settle)
json.dump(result, open(out, "w"))
shown = " ".join(f"b{b}={ms:.2f}ms" for b, ms in tpot.items())
first = " ".join(f"n{n}={ms:.2f}ms" for n, ms in ttft.items())
print(f"/health 200 after {ready:.1f} s; {len(ids)} completions of {tokens} tokens; TPOT {shown or '-'}; TTFT {first or '-'}")
EOF
  stop_server
  grep -E "foundry:|Capture .*decode|KV Cache is allocated" "$OUT/$name.log" || true
  # The prefill batches' sizes, in order: outputs compare only between starts that batched alike.
  echo "prefill batches: $(grep -o 'Prefill batch, #new-seq: [0-9]*' "$OUT/$name.log" | grep -o '[0-9]*$' | tr '\n' ' ')"
  [ "$rc" = 0 ] || { tail -n 80 "$OUT/$name.log"; exit "$rc"; }
  if [ "${STEP_LOG:-0}" = 1 ] && [ -n "${TPOT:-}" ]; then
    "$PYTHON" "$HERE/step_tpot.py" "$OUT/$name.log" "$OUT/$name.json" "$TPOT"
  fi
}

# BASELINE_ONLY=N: N unmodified starts and nothing else, compared with each other (does this
# configuration give the same outputs from one unmodified start to the next?).
if [ "${BASELINE_ONLY:-0}" -gt 0 ]; then
  names=(baseline)
  run baseline
  for i in $(seq 2 "$BASELINE_ONLY"); do run "baseline-$i"; names+=("baseline-$i"); done
  compare_tokens "unmodified starts differ from {ref}: {bad}" \
    "identical {what} ({count} completions, {distinct} distinct) across {names}" "${names[@]}"
  exit 0
fi

if [ "${LOAD_ONLY:-0}" = 1 ]; then
  run load --foundry-archive "$ARCHIVE" --foundry-mode load
  expect_restored "$RESTORED"
  exit 0
fi

names=()
if [ "${BASELINE:-1}" = 1 ]; then
  run baseline
  if grep -q "foundry: rank" "$OUT/baseline.log"; then
    echo "the unmodified start ran Foundry (FOUNDRY_* set somewhere?); see $OUT/baseline.log" >&2; exit 1
  fi
  names+=(baseline)
fi

run save --foundry-archive "$ARCHIVE" --foundry-mode save; names+=(save)
# A start that fell back would still produce identical tokens: check each did what it was asked.
expect_saved "foundry: captured [0-9]+ decode graphs in .* saved [0-9]+ graphs to "
[ "${PREFILL_GRAPHS:-1}" != 1 ] || expect_saved "foundry: captured [0-9]+ prefill graphs "

run load --foundry-archive "$ARCHIVE" --foundry-mode load; names+=(load)
expect_restored "$RESTORED"
if grep -qE "foundry: .*(cannot load the archive|does not use the archive)" "$OUT/load.log"; then
  echo "the LOAD start fell back (see $OUT/load.log)" >&2; exit 1
fi
saved=$(grep -oE "captured [0-9]+ decode graphs" "$OUT/save.log" | grep -oE "[0-9]+" | head -n1)
restored=$(grep -oE "restored [0-9]+ decode graphs" "$OUT/load.log" | grep -oE "[0-9]+" | head -n1)
[ "$saved" = "$restored" ] || { echo "SAVE captured $saved decode graphs, LOAD restored $restored" >&2; exit 1; }

compare_tokens "outputs differ from {ref}: {bad}" \
  "identical {what} ({count} completions, {distinct} distinct) across {names}" "${names[@]}"

# REPEAT=N: N-1 more unmodified and LOAD starts, alternating, for TPOT over several starts.
if [ "${REPEAT:-1}" -gt 1 ]; then
  for i in $(seq 2 "$REPEAT"); do
    if [ "${BASELINE:-1}" = 1 ]; then run "baseline-$i"; names+=("baseline-$i"); fi
    run "load-$i" --foundry-archive "$ARCHIVE" --foundry-mode load; names+=("load-$i")
    expect_log "$OUT/load-$i.log" "$RESTORED" \
      "the LOAD start load-$i restored no graphs (see $OUT/load-$i.log)"
    variants=()
    [ -z "${ALSO_INSTANTIATE:-}" ] || variants+=("load-$ALSO_INSTANTIATE-$i:FOUNDRY_SGLANG_INSTANTIATE=$ALSO_INSTANTIATE")
    [ -z "${ALSO_ENV:-}" ] || variants+=("load-env-$i:$ALSO_ENV")
    for v in "${variants[@]}"; do
      variant=${v%%:*}
      ( export "${v#*:}"; run "$variant" --foundry-archive "$ARCHIVE" --foundry-mode load )
      names+=("$variant")
      expect_log "$OUT/$variant.log" "$RESTORED" \
        "the LOAD start $variant restored no graphs (see $OUT/$variant.log)"
    done
  done
  compare_tokens "outputs differ from {ref}: {bad}" \
    "identical {what} ({count} completions, {distinct} distinct) across {names}" "${names[@]}"
fi

# FALLBACKS=1: a corrupted archive (mode load) and a foreign one (saved with another context
# length; mode auto) must each start normally, say why in a foundry: line, and give the same tokens.
# With prefill graphs on, a start without them (mode load) must refuse the archive by that setting.
[ "${FALLBACKS:-0}" = 1 ] || exit 0
if [ "${PREFILL_GRAPHS:-1}" = 1 ]; then
  run no-prefill-graphs --foundry-archive "$ARCHIVE" --foundry-mode load --disable-prefill-cuda-graph
  expect_log "$OUT/no-prefill-graphs.log" "foundry: .*cannot load the archive .*prefill_cuda_graph" \
    "a start without prefill graphs did not refuse the archive by that setting (see $OUT/no-prefill-graphs.log)"
  # Eager prefill is not the graphs' prefill: its outputs are reported, not required to match.
  "$PYTHON" "$HERE/../same_outputs.py" "$OUT/save.json" "$OUT/no-prefill-graphs.json" \
    | sed 's/^/no-prefill-graphs against save (eager prefill, for information): /' || true
fi
corrupt_archive_copy "$ARCHIVE" "$ARCHIVE-corrupt"
run corrupt --foundry-archive "$ARCHIVE-corrupt" --foundry-mode load
expect_log "$OUT/corrupt.log" "foundry: .*cannot load the archive" "the corrupted archive was not refused (see $OUT/corrupt.log)"
rm -rf "$ARCHIVE-foreign" && cp -r "$ARCHIVE" "$ARCHIVE-foreign"
# Twice the context, so that every prompt of LENGTHS still fits.
run foreign --foundry-archive "$ARCHIVE-foreign" --foundry-mode auto --context-length $((CONTEXT_LENGTH * 2))
expect_log "$OUT/foreign.log" "foundry: .*does not use the archive" "the foreign archive was not refused (see $OUT/foreign.log)"
expect_log "$OUT/foreign.log" "foundry: captured [0-9]+ decode graphs in .* saved" "auto mode saved no fresh archive (see $OUT/foreign.log)"
compare_tokens "outputs differ from {ref}: {bad}" \
  "identical {what} ({count} completions, {distinct} distinct) across {names} after the fallbacks" "${names[@]}" corrupt foreign

# shellcheck shell=bash
# Shared by recipe/*/save_then_load.sh (sourced, never run): the steps every engine's recipe takes
# the same way, so a fix to one (the /health wait, the token comparison, the log checks) reaches
# all. Each function names what it reads; PYTHON and OUT come from the sourcing script.

RECIPE_LIB_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# ensure_tiny_model MODEL_DIR: writes a tiny model there unless it has a config.json, with
# TINY_MODEL or the enginepack's tiny_model.py (beside the checkout or one level up); then, unless
# WEIGHTS=dummy or the folder has weights, random weights of a normal scale (random_weights.py), so
# that completions depend on the prompt and a wrong restore cannot hide behind the dummy weights'
# one completion for every prompt. A model too large for them (the 8B shapes) keeps dummy weights,
# with a line that says so; any other failure stops the recipe.
ensure_tiny_model() {
  local model="$1" gen="${TINY_MODEL:-}" cand
  if [ ! -f "$model/config.json" ]; then
    for cand in "$RECIPE_LIB_DIR/../shared/tools/enginepack/tiny_model.py" \
                "$RECIPE_LIB_DIR/../../shared/tools/enginepack/tiny_model.py"; do
      [ -n "$gen" ] || { [ -f "$cand" ] && gen="$cand"; }
    done
    [ -n "$gen" ] || { echo "tiny_model.py not found; set TINY_MODEL" >&2; exit 1; }
    "$PYTHON" "$gen" "$model"
  fi
  ensure_weights "$model" || exit
}

# ensure_weights MODEL_DIR: random weights (random_weights.py) for a folder without any, unless
# WEIGHTS=dummy; a model too large for them keeps the engine's dummy weights with a line saying so.
# Returns random_weights.py's status on any other failure.
ensure_weights() {
  [ "${WEIGHTS:-random}" != dummy ] && [ "$(load_format "$1")" = dummy ] || return 0
  local rc=0
  "$PYTHON" "$RECIPE_LIB_DIR/random_weights.py" "$1" || rc=$?
  case $rc in
    0) ;;
    3) echo "$1: the engine's dummy weights (too large for random ones)" ;;
    *) return "$rc" ;;
  esac
}

# load_format MODEL_DIR: "auto" when the folder holds weights (*.safetensors), else "dummy" (the
# engine fills them); every start of a recipe passes it, so all of them run the same weights.
load_format() {
  if compgen -G "$1/*.safetensors" > /dev/null; then echo auto; else echo dummy; fi
}

# wait_for_health PORT LIMIT_S PID T0 EXITED_MESSAGE TIMEOUT_MESSAGE: polls
# http://127.0.0.1:PORT/health until it answers 200 and prints the seconds since T0 (date +%s.%N).
# Fails with EXITED_MESSAGE when PID is gone first, with TIMEOUT_MESSAGE (where "{limit:.0f}"
# stands for LIMIT_S) after LIMIT_S seconds: a server that died is not waited for.
wait_for_health() {
  "$PYTHON" - "$@" <<'EOF'
import os, sys, time, urllib.request
port, limit, pid, t0 = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
exited, timed_out = sys.argv[5], sys.argv[6]
while True:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            if r.status == 200:
                break
    except Exception:
        pass
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit(exited)
    if time.time() - t0 > limit:
        sys.exit(timed_out.format(limit=limit))
    time.sleep(0.2)
print(time.time() - t0)
EOF
}

# run_when_healthy PORT LIMIT_S PID T0 EXITED_MESSAGE TIMEOUT_MESSAGE ARG...: waits as
# wait_for_health does, then runs the Python program on stdin with ARG... and the seconds to ready
# as its last argument (the engine's requests go there); returns the first failure's status.
run_when_healthy() {
  local ready
  ready=$(wait_for_health "$1" "$2" "$3" "$4" "$5" "$6") || return
  shift 6
  "$PYTHON" - "$@" "$ready"
}

# expect_log LOG PATTERN MESSAGE: exits with MESSAGE unless LOG has a line matching PATTERN (-E).
expect_log() {
  grep -qE "$2" "$1" || { echo "$3" >&2; exit 1; }
}

# expect_saved PATTERN / expect_restored PATTERN: the SAVE start wrote an archive and the LOAD
# start restored from it, as OUT/save.log and OUT/load.log say. A start that fell back would still
# produce identical tokens, so these lines are the proof that each did what it was asked.
expect_saved() {
  expect_log "$OUT/save.log" "$1" "the SAVE start wrote no archive (see $OUT/save.log)"
}

expect_restored() {
  expect_log "$OUT/load.log" "$1" "the LOAD start restored no graphs (see $OUT/load.log)"
}

# compare_tokens DIFFER_MESSAGE SAME_MESSAGE NAME...: the starts' ready times, then a failure with
# DIFFER_MESSAGE unless every OUT/NAME.json holds the outputs of the first (same_outputs.py: the
# greedy tokens and, where recorded, their log-probabilities bit for bit); else SAME_MESSAGE.
# In the messages, {ref} is the first name, {bad} the differing ones with their first difference,
# {what} what was compared, {count} the number of completions, {distinct} how many of the first's
# differ from one another, {names} all names.
compare_tokens() {
  "$PYTHON" - "$RECIPE_LIB_DIR" "$OUT" "$@" <<'EOF'
import json, sys
sys.path.insert(0, sys.argv[1])
from same_outputs import compare
out, differ, same, names = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
runs = {n: json.load(open(f"{out}/{n}.json")) for n in names}
for n, r in runs.items():
    print(f"{n:9s} ready {r['ready_s']:6.1f} s")
result = compare(names[0], runs)
if result.differences:
    sys.exit(differ.format(ref=names[0], bad="; ".join(f"{n} ({why})" for n, why in result.differences.items())))
print(same.format(what=result.what, count=result.count, distinct=result.distinct, names=", ".join(names)))
EOF
}

# corrupt_archive_copy SRC DST: DST becomes a copy of the archive SRC with one byte flipped in the
# middle of rank0/graphs.fgr (a corrupt archive: its LOAD must fall back, naming the checksum).
corrupt_archive_copy() {
  rm -rf "$2" && cp -r "$1" "$2"
  "${PYTHON:-python3}" - "$2/rank0/graphs.fgr" <<'EOF'
import os, sys
path = sys.argv[1]
with open(path, "r+b") as f:
    f.seek(os.path.getsize(path) // 2)
    b = f.read(1)
    f.seek(-1, 1)
    f.write(bytes([b[0] ^ 0xFF]))
EOF
}

# byte_compile LOG NAME DIR...: writes the bytecode of the Python sources under DIR..., as pip
# install does by default (up-to-date bytecode is kept). Where PYTHONDONTWRITEBYTECODE is set,
# sources without it are compiled again by every process of every start, which a user's
# pip-installed engine does not do. Output to LOG; prints one line naming NAME.
byte_compile() {
  local log=$1 name=$2 t0=$SECONDS first rc=0 failed note=""; shift 2
  first=$(( $(cat "$log" 2>/dev/null | wc -l) + 1 ))
  "$PYTHON" -m compileall -q -j 0 "$@" >> "$log" 2>&1 || rc=$?
  failed=$(tail -n +"$first" "$log" | grep -c '^\*\*\* Error compiling' || true)
  if [ "$rc" != 0 ] && [ "$failed" = 0 ]; then
    echo "  byte-compiling $name failed (rc $rc, see $(basename "$log"))"; return
  fi
  [ "$failed" = 0 ] || note="; $failed file(s) not valid for this Python, so never imported by it (see $(basename "$log"))"
  echo "  $name byte-compiled in $((SECONDS - t0)) s (PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-unset})$note"
}

# byte_compile_starts LOG ENGINE SITE PLUGIN: byte_compile for what a start imports: the engine's
# pack at SITE, the site directory of this Python's torch (with the image's other packages), and
# Foundry's sources with the engine's plugin package PLUGIN.
byte_compile_starts() {
  local log=$1 engine=$2 site=$3 plugin=$4 torch_site
  byte_compile "$log" "the $engine pack ($site)" "$site"
  torch_site=$("$PYTHON" -c 'import importlib.util as u, os
print(os.path.dirname(list(u.find_spec("torch").submodule_search_locations)[0]))') \
    && byte_compile "$log" "torch's site ($torch_site)" "$torch_site"
  byte_compile "$log" "Foundry's sources" foundry_core "$plugin"
}

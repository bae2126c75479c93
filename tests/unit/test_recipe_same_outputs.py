"""recipe/same_outputs.py and the recipes' compare_tokens (recipe/lib.sh): which starts' outputs match."""

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("recipe_same_outputs", ROOT / "recipe" / "same_outputs.py")
same_outputs = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = same_outputs  # its dataclass looks its module up there
_spec.loader.exec_module(same_outputs)

TOKENS = [[5, 6, 7], [8, 9, 10], [5, 6, 7]]
LOGPROBS = [[-0.5, -1.25, -2.0], [-0.75, -0.125, -3.5], [-0.5, -1.25, -2.0]]


def run(tokens=TOKENS, logprobs=LOGPROBS) -> dict:
    out = {"ready_s": 1.0, "tokens": [t if isinstance(t, str) else list(t) for t in tokens]}
    if logprobs is not None:
        out["logprobs"] = [None if x is None else list(x) for x in logprobs]
    return out


def test_identical_tokens_and_logprobs_are_the_same_and_counted():
    result = same_outputs.compare("a", {"a": run(), "b": run()})
    assert result.differences == {}
    assert result.what == "greedy tokens and log-probabilities"
    assert (result.count, result.distinct) == (3, 2)


def test_a_logprob_one_ulp_away_is_a_difference_with_its_place():
    lp = [list(x) for x in LOGPROBS]
    lp[1][2] = math.nextafter(lp[1][2], 0.0)
    result = same_outputs.compare("a", {"a": run(), "b": run(logprobs=lp)})
    assert set(result.differences) == {"b"}
    assert result.differences["b"].startswith("completion 1, token 2: log-probability")


def test_a_different_token_is_named_before_the_logprobs():
    tokens = [list(t) for t in TOKENS]
    tokens[2][1] = 99
    lp = [list(x) for x in LOGPROBS]
    lp[0][0] = -0.25  # an earlier completion's log-probability differs too
    why = same_outputs.compare("a", {"a": run(), "b": run(tokens=tokens, logprobs=lp)}).differences["b"]
    assert why == "completion 2, token 1: [99], not [6]"


def test_signed_zero_missing_and_fewer_logprob_lists_are_differences():
    zero = [[0.0, -1.25, -2.0]] + LOGPROBS[1:]
    negative_zero = [[-0.0, -1.25, -2.0]] + LOGPROBS[1:]
    assert "token 0: log-probability -0.0, not 0.0" in \
        same_outputs.compare("a", {"a": run(logprobs=zero), "b": run(logprobs=negative_zero)}).differences["b"]
    missing = [None] + LOGPROBS[1:]  # the server returned none for the first completion
    assert same_outputs.compare("a", {"a": run(), "b": run(logprobs=missing)}).differences["b"] == \
        "completion 0, no log-probabilities"
    assert same_outputs.compare("a", {"a": run(logprobs=missing), "b": run(logprobs=missing)}).differences == {}
    assert same_outputs.compare("a", {"a": run(), "b": run(logprobs=LOGPROBS[:2])}).differences["b"] == \
        "log-probabilities of 2 completions, not 3"


def test_a_shorter_completion_and_a_missing_one_are_differences():
    short = [list(t) for t in TOKENS]
    short[0] = short[0][:2]
    assert "completion 0, token 2" in same_outputs.compare("a", {"a": run(), "b": run(tokens=short)}).differences["b"]
    assert same_outputs.compare("a", {"a": run(), "b": run(tokens=TOKENS[:2])}).differences["b"] == "2 completions, not 3"


def test_without_logprobs_in_every_run_only_tokens_are_compared():
    lp = [[0.0] * 3 for _ in TOKENS]  # would differ, but the reference recorded none
    result = same_outputs.compare("a", {"a": run(logprobs=None), "b": run(logprobs=lp)})
    assert result.differences == {} and result.what == "greedy tokens"


def test_a_reference_without_any_logprob_is_not_reported_as_compared_logprobs():
    none = [None] * len(TOKENS)  # a server that returned no log-probabilities at all
    result = same_outputs.compare("a", {"a": run(logprobs=none), "b": run(logprobs=none)})
    assert result.differences == {} and result.what == "greedy tokens"


def test_nan_and_none_logprobs_match_only_their_own_kind():
    lp = [[float("nan"), None, -1.0]] + LOGPROBS[1:]
    assert same_outputs.compare("a", {"a": run(logprobs=lp), "b": run(logprobs=lp)}).differences == {}
    other = [[float("nan"), -1.0, -1.0]] + LOGPROBS[1:]
    assert "token 1" in same_outputs.compare("a", {"a": run(logprobs=lp), "b": run(logprobs=other)}).differences["b"]


def test_text_completions_compare_as_text():
    result = same_outputs.compare("a", {"a": run(tokens=["x y", "z"], logprobs=None),
                                        "b": run(tokens=["x y", "w"], logprobs=None)})
    assert result.differences["b"] == "completion 1: 'w', not 'z'"


def _write(directory: Path, name: str, data: dict) -> str:
    path = directory / f"{name}.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_cli_exit_status_and_report(tmp_path):
    ref, same = _write(tmp_path, "baseline", run()), _write(tmp_path, "load", run())
    tokens = [list(t) for t in TOKENS]
    tokens[0][0] = 1
    other = tmp_path / "x"
    other.mkdir()
    bad = _write(other, "load", run(tokens=tokens))  # a stem seen twice: named by its path
    ok = subprocess.run([sys.executable, str(ROOT / "recipe" / "same_outputs.py"), ref, same, ref],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "load: identical greedy tokens and log-probabilities (3 prompts) vs baseline" in ok.stdout
    assert "baseline: 2 distinct completions of 3" in ok.stdout
    failed = subprocess.run([sys.executable, str(ROOT / "recipe" / "same_outputs.py"), ref, same, bad],
                            capture_output=True, text=True)
    assert failed.returncode == 1
    assert f"{bad}: DIFFERENT from baseline: completion 0, token 0: [1], not [5]" in failed.stdout
    usage = subprocess.run([sys.executable, str(ROOT / "recipe" / "same_outputs.py"), ref], capture_output=True, text=True)
    assert usage.returncode == 2 and "Usage" in usage.stderr


def _compare_tokens(out: Path, *names: str) -> subprocess.CompletedProcess:
    script = ('source recipe/lib.sh; compare_tokens "outputs differ from {ref}: {bad}" '
              '"identical {what} ({count} prompts, {distinct} distinct) across {names}" "$@"')
    return subprocess.run(["bash", "-c", script, "compare", *names], cwd=ROOT, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "OUT": str(out)})


def test_recipe_compare_tokens_reports_what_it_compared(tmp_path):
    _write(tmp_path, "baseline", run())
    _write(tmp_path, "load", run())
    lp = [list(x) for x in LOGPROBS]
    lp[0][0] = -0.5000001
    _write(tmp_path, "save", run(logprobs=lp))
    ok = _compare_tokens(tmp_path, "baseline", "load")
    assert ok.returncode == 0, ok.stderr
    assert "identical greedy tokens and log-probabilities (3 prompts, 2 distinct) across baseline, load" in ok.stdout
    failed = _compare_tokens(tmp_path, "baseline", "load", "save")
    assert failed.returncode == 1
    assert "outputs differ from baseline: save (completion 0, token 0: log-probability" in failed.stderr


def test_recipe_load_format_follows_the_folder(tmp_path):
    def load_format() -> str:
        return subprocess.run(["bash", "-c", 'source recipe/lib.sh; load_format "$1"', "lf", str(tmp_path)],
                              cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()

    assert load_format() == "dummy"
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert load_format() == "auto"

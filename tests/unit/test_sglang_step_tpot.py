"""recipe/sglang/step_tpot.py: SGLang's per-step decode lines turned into step times per batch size."""

import importlib.util
import json
from pathlib import Path

_PATH = Path(__file__).resolve().parents[2] / "recipe" / "sglang" / "step_tpot.py"
_spec = importlib.util.spec_from_file_location("step_tpot", _PATH)
step_tpot = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(step_tpot)

_FMT = ("[2026-11-30 01:58:0{s}] Decode batch, #running-req: {n}, #token: 1083, token usage: 0.00, cuda graph: True, "
        "gen throughput (token/s): {t:.2f}, #queue-req: 0\n")


def _log(*steps) -> str:
    return "".join(_FMT.format(s=i % 10, n=n, t=n / ms * 1e3) for i, (n, ms) in enumerate(steps))


def test_median_step_time_per_batch_size():
    text = _log((8, 6.0), (8, 6.2), (8, 40.0), (8, 6.1), (1, 5.0), (1, 5.2), (1, 5.1), (32, 7.0))
    text += "[2026-11-30 01:58:03] Prefill batch, #new-seq: 8, #new-token: 64\n"  # not a decode step
    medians, counts = step_tpot.step_tpot(text, [1, 8, 128])
    assert abs(medians["8"] - 6.15) < 1e-3  # the 40 ms step (after a prefill) does not move the median
    assert abs(medians["1"] - 5.1) < 1e-3
    assert "128" not in medians and counts == {"1": 3, "8": 4}


def test_main_adds_the_step_times_to_the_start_json(tmp_path, capsys):
    log, result = tmp_path / "load.log", tmp_path / "load.json"
    log.write_text(_log((32, 6.5), (32, 6.7), (32, 6.6)))
    result.write_text(json.dumps({"ready_s": 40.0, "tpot_ms": {"32": 7.1}}))
    assert step_tpot.main([str(log), str(result), "1,32"]) == 0
    data = json.loads(result.read_text())
    assert abs(data["step_tpot_ms"]["32"] - 6.6) < 1e-3 and data["step_tpot_steps"] == {"32": 3}
    assert data["tpot_ms"] == {"32": 7.1}  # the request-level TPOT is kept
    assert "b32=6.60ms" in capsys.readouterr().out


def test_wrong_arguments_print_the_usage(capsys):
    assert step_tpot.main(["only-one"]) == 2
    assert "Usage" in capsys.readouterr().err

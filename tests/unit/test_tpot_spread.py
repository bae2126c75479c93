"""recipe/tpot_spread.py: TPOT medians and ranges over repeated starts, from results written here."""

import importlib.util
import json
from pathlib import Path

_PATH = Path(__file__).resolve().parents[2] / "recipe" / "tpot_spread.py"
_spec = importlib.util.spec_from_file_location("tpot_spread", _PATH)
tpot_spread = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tpot_spread)


def _start(directory: Path, name: str, b1: float, b8: float) -> None:
    (directory / f"{name}.json").write_text(json.dumps({"ready_s": 1.0, "tpot_ms": {"1": b1, "8": b8}}))


def test_kinds_group_numbered_starts_and_compare_medians(tmp_path, capsys):
    _start(tmp_path, "captured-1", 5.0, 6.0)
    _start(tmp_path, "captured-2", 5.2, 6.6)
    _start(tmp_path, "captured-10", 4.9, 6.3)
    _start(tmp_path, "load", 5.1, 6.3)  # unnumbered: the kind's start 0
    _start(tmp_path, "load-2", 5.05, 6.3)
    (tmp_path / "notes.json").write_text(json.dumps({"ready_s": 3.0}))  # no TPOT: not a start
    kinds = tpot_spread.runs_by_kind(tmp_path)
    assert list(kinds) == ["captured", "load"]
    assert [t["1"] for t in kinds["captured"]] == [5.0, 5.2, 4.9]  # start number order, 10 last
    assert tpot_spread.main([str(tmp_path), "--reference", "captured"]) == 0
    out = capsys.readouterr().out
    assert "| captured | 3 | 5.000 (4.900-5.200) | 6.300 (6.000-6.600) |" in out
    # load's medians 5.075 and 6.3 against captured's 5.0 and 6.3.
    assert "| load: median against captured's | +1.5 % | +0.0 % |" in out
    assert "| captured: its own starts' range around its median | -2.0 / +4.0 % | -4.8 / +4.8 % |" in out


def test_an_unknown_reference_is_named(tmp_path, capsys):
    _start(tmp_path, "load-1", 5.0, 6.0)
    assert tpot_spread.main([str(tmp_path), "--reference", "captured"]) == 1
    assert "no starts of kind 'captured'" in capsys.readouterr().err


def test_another_key_is_compared_when_asked(tmp_path, capsys):
    for name, http, step in (("baseline", 6.0, 5.0), ("baseline-2", 7.0, 5.1), ("load", 6.5, 5.05)):
        (tmp_path / f"{name}.json").write_text(json.dumps({"tpot_ms": {"8": http}, "step_tpot_ms": {"8": step}}))
    assert tpot_spread.main([str(tmp_path), "--reference", "baseline", "--key", "step_tpot_ms"]) == 0
    out = capsys.readouterr().out
    assert "| baseline | 2 | 5.050 (5.000-5.100) |" in out
    assert "| load: median against baseline's | +0.0 % |" in out
    assert tpot_spread.main([str(tmp_path), "--key", "missing_ms"]) == 1
    assert "no <kind>-<n>.json with missing_ms" in capsys.readouterr().err


def test_prompt_lengths_are_labelled_as_such(tmp_path, capsys):
    # TTFT per prompt length: the columns say n<tokens>, not b<batch>.
    for name, ms in (("baseline", 30.0), ("baseline-2", 32.0), ("load", 31.0)):
        (tmp_path / f"{name}.json").write_text(json.dumps({"ttft_ms": {"900": ms}}))
    assert tpot_spread.main([str(tmp_path), "--reference", "baseline", "--key", "ttft_ms", "--label", "n"]) == 0
    out = capsys.readouterr().out
    assert "| kind | starts | n900 ms median (min-max) |" in out
    assert "| baseline | 2 | 31.000 (30.000-32.000) |" in out
    assert "| load: median against baseline's | +0.0 % |" in out
    assert "b900" not in out


def test_counts_are_named_by_their_unit_and_a_zero_reference_is_not_divided_by(tmp_path, capsys):
    for name, faults in (("baseline", 0), ("baseline-2", 0), ("load", 412)):
        (tmp_path / f"{name}.json").write_text(json.dumps({"ttft_faults": {"60": faults}}))
    assert tpot_spread.main([str(tmp_path), "--reference", "baseline", "--key", "ttft_faults", "--label", "n",
                             "--unit", "faults"]) == 0
    out = capsys.readouterr().out
    assert "| kind | starts | n60 faults median (min-max) |" in out
    assert "| load | 1 | 412.000 (412.000-412.000) |" in out
    assert "| load: median against baseline's | - |" in out
    assert "| baseline: its own starts' range around its median | - |" in out


def test_a_column_the_reference_lacks_is_a_dash(tmp_path, capsys):
    (tmp_path / "base.json").write_text(json.dumps({"tpot_ms": {"1": 5.0}}))
    _start(tmp_path, "load", 5.1, 6.3)  # also b8, which base never measured
    assert tpot_spread.main([str(tmp_path), "--reference", "base"]) == 0
    out = capsys.readouterr().out
    assert "| base: its own starts' range around its median | +0.0 / +0.0 % | - |" in out
    assert "| load: median against base's | +2.0 % | - |" in out


def test_a_starts_samples_are_taken_as_their_median_or_minimum(tmp_path, capsys):
    for name, samples in (("baseline-1", [15.0, 30.0, 16.0]), ("baseline-2", [31.0, 16.5, 29.0]),
                          ("load-1", [15.2, 15.1, 33.0]), ("load-2", [])):  # no samples at a length: not counted
        (tmp_path / f"{name}.json").write_text(json.dumps({"ttft_samples_ms": {"60": samples}}))
    medians = tpot_spread.runs_by_kind(tmp_path, "ttft_samples_ms")
    assert [t["60"] for t in medians["baseline"]] == [16.0, 29.0] and len(medians["load"]) == 1
    assert [t["60"] for t in tpot_spread.runs_by_kind(tmp_path, "ttft_samples_ms", "min")["baseline"]] == [15.0, 16.5]
    assert tpot_spread.main([str(tmp_path), "--key", "ttft_samples_ms", "--of", "min", "--label", "n"]) == 0
    out = capsys.readouterr().out
    assert "| baseline | 2 | 15.750 (15.000-16.500) |" in out  # the minima 15.0 and 16.5
    assert "| load: median against baseline's | -4.1 % |" in out  # 15.1 against 15.75

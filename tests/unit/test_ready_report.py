"""`foundry ready`'s numbers: medians and ranges, the tables, the result file and the chart, from a
recorded result (the figures are made up here, in the range issue 28 measured)."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from foundry_core import cli
from foundry_core.ready import chart, report, stats
from foundry_core.ready.engines import PHASES

KINDS = ["base-warm", "save", "load-warm"]
# (kind, round, first_line, worker_first_line, engine_init_end, health, first_completion, init_engine_s, foundry)
STARTS = [
    ("base-warm", 1, 21.0, 42.0, 49.0, 51.4, 51.6, 6.44, "-"),
    ("save", 1, 21.5, 43.0, 88.0, 95.5, 95.8, 42.01, "saved"),
    ("load-warm", 1, 21.2, 45.0, 49.5, 53.6, 53.9, 2.89, "restored"),
    ("base-warm", 2, 20.0, 40.0, 47.0, 49.0, 49.3, 6.10, "-"),
    ("save", 2, 22.0, 44.0, 60.0, 62.0, 62.2, 12.30, "saved"),
    ("load-warm", 2, 20.5, 41.0, 44.0, 46.0, 46.1, 2.70, "restored"),
    ("base-warm", 3, 22.0, 44.0, 51.0, 53.0, 53.4, 6.60, "-"),
    ("save", 3, 21.0, 42.0, 58.0, 60.0, 60.3, 11.90, "saved"),
    ("load-warm", 3, 21.0, 43.0, 46.0, 48.0, 48.2, 2.75, "fell back"),
]


# Foundry's critical path of the SAVE and LOAD starts, s: (total, restart, archive check), images thread cpu
CRITICAL = {("save", 1): (0.100, 0.060, 0.040, None), ("save", 2): (0.140, 0.080, 0.060, None),
            ("save", 3): (0.120, 0.070, 0.050, None), ("load-warm", 1): (0.200, 0.050, 0.150, 0.30),
            ("load-warm", 2): (0.180, 0.060, 0.120, 0.40), ("load-warm", 3): (0.260, 0.060, 0.200, 0.50)}


def _critical(kind: str, rnd: int) -> dict:
    if (kind, rnd) not in CRITICAL:
        return {"foundry_critical_s": None, "foundry_critical": {}, "foundry_overlapped": {},
                "foundry_critical_lines": 0}
    total, restart, check, cpu = CRITICAL[kind, rnd]
    return {"foundry_critical_s": total, "foundry_critical": {"restart": restart, "archive check": check},
            "foundry_overlapped": {"images thread cpu": cpu} if cpu is not None else {},
            "foundry_critical_lines": 2}


def _start(index: int, row: tuple) -> dict:
    kind, rnd, *times, init_s, foundry = row
    return {"index": index, "kind": kind, "round": rnd, "recorded": True, "ok": True, "error": None,
            "log": f"logs/{index:02d}-r{rnd}-{kind}.log", "command": ["python3", "-m", "vllm.entrypoints.cli.main"],
            "env": {"PYTHONUNBUFFERED": "1", "FOUNDRY_ARCHIVE": None}, "phases": dict(zip(PHASES, times)),
            "markers": {}, "durations": {"init_engine_s": init_s}, "foundry": foundry, **_critical(kind, rnd)}


def _result() -> dict:
    starts = [_start(i, row) for i, row in enumerate(STARTS, 1)]
    starts.append({**_start(10, ("base-warm", 0, 30.0, 60.0, 110.0, 117.8, 118.0, 48.07, "-")), "recorded": False})
    starts.append({**_start(11, ("load-warm", 4, 1.0, 2.0, 3.0, 4.0, 5.0, 1.0, "-")), "ok": False,
                   "error": "timed out waiting for /health 200 after 900.0 s",
                   "phases": dict.fromkeys(PHASES)})
    return {"engine": "vllm", "model": "/tmp/tiny-qwen3", "kinds": KINDS, "rounds": 3, "phases": list(PHASES),
            "environment": {"engine_version": "0.25.0", "gpu": {"name": "NVIDIA H200"}},
            "starts": starts, "summary": stats.summarise(starts, KINDS)}


def _text(renderable) -> str:
    console = Console(width=250, record=True)
    console.print(renderable)
    return console.export_text()


def test_median_and_range_per_kind_and_phase_over_the_starts_that_reached_ready():
    summary = _result()["summary"]
    health = stats.spread(summary["base-warm"]["phases"]["health"])
    assert (health.median, health.min, health.max, health.n) == (51.4, 49.0, 53.0, 3)  # not the warm-up's 117.8
    assert summary["load-warm"]["starts"] == 4 and summary["load-warm"]["ok"] == 3  # the timed-out start
    assert stats.spread(summary["save"]["durations"]["init_engine_s"]).median == 12.30
    assert summary["load-warm"]["foundry"] == {"restored": 2, "fell back": 1}


def test_spread_text():
    assert stats.Spread.of([3.0, 1.0, 2.0]).text() == "2.0 (1.0-3.0)"
    assert stats.Spread.of([2.345]).text(2) == "2.35"
    with pytest.raises(ValueError):
        stats.Spread.of([])


def test_phases_table_has_a_row_per_kind_with_median_and_range():
    text = _text(report.phases_table(_result()))
    assert "vllm 0.25.0" in text and "NVIDIA H200" in text
    row = next(line for line in text.splitlines() if "base-warm" in line)
    assert "3/3" in row and "51.4 (49.0-53.0)" in row and "51.6 (49.3-53.4)" in row and "none 3" in row
    load = next(line for line in text.splitlines() if "load-warm" in line)
    assert "3/4" in load and "fell back 1, restored 2" in load


def test_critical_path_median_and_range_per_kind():
    summary = _result()["summary"]
    assert stats.spread(summary["save"]["foundry_critical_s"]) == stats.Spread(0.12, 0.1, 0.14, 3)
    assert summary["base-warm"]["foundry_critical_s"] is None and summary["base-warm"]["foundry_critical"] == {}
    assert stats.spread(summary["load-warm"]["foundry_critical"]["archive check"]).median == 0.15
    assert stats.spread(summary["load-warm"]["foundry_overlapped"]["images thread cpu"]).max == 0.5
    assert "images thread cpu" not in summary["save"]["foundry_overlapped"]


def test_phases_table_has_a_critical_path_column():
    text = _text(report.phases_table(_result()))
    assert "Foundry's critical path" in text
    save = next(line for line in text.splitlines() if line.lstrip("│ ").startswith("save"))
    assert save.rstrip(" │").endswith("0.120 (0.100-0.140)")
    load = next(line for line in text.splitlines() if "load-warm" in line)
    assert load.rstrip(" │").endswith("0.200 (0.180-0.260)")
    base = next(line for line in text.splitlines() if "base-warm" in line)
    assert base.rstrip(" │").endswith("-")  # an unmodified start has no Foundry on its path


def test_critical_table_lists_each_item_per_kind():
    text = _text(report.critical_table(_result()))
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in text.splitlines() if line.startswith("│")}
    assert rows["total"] == ["-", "0.120 (0.100-0.140)", "0.200 (0.180-0.260)"]
    assert rows["restart"] == ["-", "0.070 (0.060-0.080)", "0.060 (0.050-0.060)"]
    assert rows["archive check"] == ["-", "0.050 (0.040-0.060)", "0.150 (0.120-0.200)"]
    assert rows["images thread cpu (overlapped, not in the total)"] == ["-", "-", "0.400 (0.300-0.500)"]


def test_a_result_from_before_the_critical_path_prints_without_it():
    result = _result()
    for s in result["summary"].values():
        for key in ("foundry_critical_s", "foundry_critical", "foundry_overlapped"):
            del s[key]
    assert report.critical_table(result) is None
    base = next(line for line in _text(report.phases_table(result)).splitlines() if "save" in line)
    assert base.rstrip(" │").endswith("-")


def test_durations_table_lists_what_the_engine_reported():
    text = _text(report.durations_table(_result()))
    assert "init_engine_s" in text and "6.44 (6.10-6.60)" in text and "2.75 (2.70-2.89)" in text


def test_failures_name_the_start_and_what_went_wrong():
    lines = report.failures(_result())
    assert any("round 3 load-warm: Foundry did not restore (it says: fell back)" in line for line in lines)
    assert any("round 4 load-warm: timed out waiting for /health 200" in line for line in lines)
    assert len(lines) == 2


def test_json_round_trip(tmp_path):
    result = _result()
    path = tmp_path / "ready-vllm.json"
    report.write(result, path)
    back = report.read(path)
    assert back["format"] == report.FORMAT and back["version"] == report.VERSION
    assert {k: v for k, v in back.items() if k not in ("format", "version")} == json.loads(json.dumps(result))
    assert not (tmp_path / "ready-vllm.json.tmp").exists()


@pytest.mark.parametrize("content, message", [
    ("{", "not JSON"), ('{"engine": "vllm"}', "not a `foundry ready` result"),
    ('{"format": "foundry-ready", "version": 99}', "result version 99"),
    ('{"format": "foundry-ready", "version": 1, "engine": "vllm"}', "has no 'kinds'")])
def test_other_files_are_refused_with_the_reason(tmp_path, content, message):
    path = tmp_path / "r.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        report.read(path)


def test_chart_from_a_recorded_result(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (the bench extra): no chart to check")
    path = tmp_path / "ready-vllm.json"
    report.write(_result(), path)
    png = chart.draw(report.read(path), tmp_path / "chart.png")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 20_000  # bars, whiskers, labels and legend, not an empty canvas


def test_report_command_prints_and_draws_again(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (the bench extra): no chart to check")
    path = tmp_path / "ready-vllm.json"
    report.write(_result(), path)
    assert cli.main(["ready", "report", str(path)]) == 0
    assert (tmp_path / "ready-vllm.png").stat().st_size > 20_000


def test_report_command_refuses_a_file_that_is_not_a_result(tmp_path, capsys):
    path = tmp_path / "other.json"
    path.write_text("[]")
    assert cli.main(["ready", "report", str(path)]) == 2
    assert "not a `foundry ready` result" in capsys.readouterr().err


def test_without_matplotlib_the_chart_is_skipped_with_a_reason(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("no matplotlib")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(chart.MatplotlibMissing, match="pip install 'foundry-core\\[bench\\]'"):
        chart.draw(_result(), tmp_path / "c.png")
    assert not (tmp_path / "c.png").exists()


# What each cache held after a cold LOAD, by round: {variable: (files, bytes)}.
COLD_CACHES = {1: {"TRITON_CACHE_DIR": (120, 30 * 2 ** 20), "FLASHINFER_WORKSPACE_BASE": (4, 200 * 2 ** 20)},
               2: {"TRITON_CACHE_DIR": (100, 20 * 2 ** 20), "FLASHINFER_WORKSPACE_BASE": (4, 201 * 2 ** 20)},
               3: {"TRITON_CACHE_DIR": (110, 25 * 2 ** 20), "TVM_FFI_CACHE_DIR": (2, 2 ** 20)}}


def _cold_result() -> dict:
    """The recorded result with a LOAD on empty caches each round, its caches listed after it."""
    result = _result()
    result["kinds"] = [*KINDS, "load-cold"]
    for rnd, held in COLD_CACHES.items():
        start = _start(len(result["starts"]) + 1, ("load-cold", rnd, 21.0, 43.0, 90.0, 95.0, 95.5, 40.0, "restored"))
        start["caches_after"] = {name: {"files": 0, "bytes": 0, "top": []} for name in
                                 ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE",
                                  "TVM_FFI_CACHE_DIR", "HOME")}
        start["caches_after"].update({name: {"files": f, "bytes": b, "top": ["x"]} for name, (f, b) in held.items()})
        result["starts"].append(start)
    result["summary"] = stats.summarise(result["starts"], result["kinds"])
    return result


def test_report_prints_what_each_cache_held_after_a_cold_start(tmp_path):
    path = tmp_path / "ready-vllm.json"
    report.write(_cold_result(), path)
    result = report.read(path)
    console = Console(width=250, record=True)
    report.print_result(result, console)
    text = console.export_text()
    title = "load-cold caches after the start: median (min-max) of 3"
    assert text.count("caches after the start") == 1 and title in text  # the warm kinds list none
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in text.split(title)[1].splitlines() if line.startswith("│")}
    assert rows == {"TRITON_CACHE_DIR": ["110 (100-120)", "25.0 (20.0-30.0)"],
                    "FLASHINFER_WORKSPACE_BASE": ["4 (0-4)", "200.0 (0.0-201.0)"],
                    "TVM_FFI_CACHE_DIR": ["0 (0-2)", "0.0 (0.0-1.0)"]}  # a cache that held nothing: no row
    for table in (report.phases_table(result), report.durations_table(result), report.critical_table(result)):
        assert _text(table) in text  # the other tables as they were


def test_the_cold_caches_table_counts_the_files_not_from_the_archive_where_they_were_compared():
    result = _cold_result()
    for count, start in zip((37, 33, 35), [s for s in result["starts"] if s["kind"] == "load-cold"]):
        start["caches_after"]["TRITON_CACHE_DIR"].update(not_carried=count, not_carried_paths=["k/a.so"])
    table = report.cold_caches_tables(result)[0]
    text = _text(table)
    assert "not from the archive" in text and "35 (33-37)" in text
    lines = report.not_carried(result)
    assert len(lines) == 3 and lines[0] == ("round 1 load-cold wrote files the archive does not carry: "
                                            "TRITON_CACHE_DIR 37 (k/a.so and 36 more)")


def test_a_result_without_cache_listings_prints_no_cache_table():
    assert report.cold_caches_tables(_result()) == []

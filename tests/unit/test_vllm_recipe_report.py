"""recipe/vllm/report.py: the timing table's runs and startup steps, from logs written here."""

import importlib.util
import json
from pathlib import Path

_PATH = Path(__file__).resolve().parents[2] / "recipe" / "vllm" / "report.py"
_spec = importlib.util.spec_from_file_location("vllm_recipe_report", _PATH)
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)

_TP_LOG = """\
(Worker_TP0 pid=100) INFO 11-29 23:29:13 [foundry.vllm] foundry: memory profiling took 49.72 s
(Worker_TP1 pid=101) INFO 11-29 23:29:13 [foundry.vllm] foundry: memory profiling took 49.13 s
(Worker_TP0 pid=100) INFO 11-29 23:26:56 [backends.py:393] torch.compile takes 10.00 s in total
(Worker_TP0 pid=100) INFO 11-29 23:26:58 [backends.py:393] torch.compile takes 5.50 s in total
(Worker_TP1 pid=101) INFO 11-29 23:26:58 [backends.py:393] torch.compile takes 12.00 s in total
"""


def test_steps_of_parallel_ranks_are_the_slowest_rank_not_their_sum(tmp_path):
    log = tmp_path / "save.log"
    log.write_text(_TP_LOG)
    found = report.steps(log)
    assert found["memory profiling"] == 49.72
    # Two compile lines of one process add up (15.5 s); the other rank took 12 s.
    assert found["torch.compile"] == 15.5


def test_steps_without_process_tags_add_up(tmp_path):
    log = tmp_path / "load.log"
    log.write_text("foundry: memory profiling took 1.5 s\nfoundry: memory profiling took 2.0 s\n")
    assert report.steps(log)["memory profiling"] == 3.5


def _run(directory: Path, name: str, tokens: list, ready: float) -> None:
    (directory / f"{name}.json").write_text(json.dumps({"ready_s": ready, "tokens": tokens, "tpot_ms": {"1": 5.0}}))
    (directory / f"{name}.log").write_text("foundry: restored 3 graphs in 0.1 s\n" if "load" in name else "")


def test_timing_says_how_much_shorter_each_restoring_starts_graph_step_is(tmp_path, capsys):
    step = "foundry: capture_model (capture or restore) took {} s\n"
    for name, ready, log in (
            ("captured-1", 40.0, "Graph capturing finished in 5 secs, took 1.00 GiB\n"),
            ("captured-2", 41.0, "Graph capturing finished in 6 secs, took 1.00 GiB\n"),
            ("save", 70.0, "[foundry] saved 3 graphs (1 groups, 9 nodes, 2 images)\n" + step.format(5.57)),
            ("load-1", 30.0, "foundry: restored 3 graphs in 0.3 s\n" + step.format(0.5))):
        (tmp_path / f"{name}.json").write_text(json.dumps({"ready_s": ready, "tokens": [[1]], "tpot_ms": {}}))
        (tmp_path / f"{name}.log").write_text(log)
    assert report.timing(str(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "  load-1: graph step 0.50 s: 11.1x shorter than SAVE's 5.57 s, 10.0x than the unmodified start's 5 s" in out
    assert "captured-1: graph step" not in out and "save: graph step" not in out


def test_timing_lists_known_runs_first_then_any_other(tmp_path, capsys):
    _run(tmp_path, "load-background", [[1, 2]], 31.0)
    _run(tmp_path, "load", [[1, 2]], 32.0)
    _run(tmp_path, "captured-warm", [[1, 2]], 38.0)
    assert report.timing(str(tmp_path)) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "s |" not in line]
    names = [row.split("|")[1].strip() for row in rows if not row.startswith("| run") and not row.startswith("| step")]
    assert names[:3] == ["captured-warm", "load", "load-background"]
    assert "| load-background | 31.0 | 5.00 | - | - | - | identical | restored |" in rows

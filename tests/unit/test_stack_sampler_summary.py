"""scripts/stack_sampler/summarize.py --within: seconds inside one frame, from samples written here."""

import importlib.util
from pathlib import Path

_PATH = Path(__file__).resolve().parents[2] / "scripts" / "stack_sampler" / "summarize.py"
_spec = importlib.util.spec_from_file_location("stack_summary", _PATH)
summary = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(summary)

_SAMPLES = """\
# pid 7 argv python start.py
100.000\tstart.py:main:1;model_runner.py:capture_model:5;__init__.py:collect:1
100.300\tstart.py:main:1;model_runner.py:capture_model:6;graphs.py:load_graphs:9
100.400\tstart.py:main:1;model_runner.py:capture_model:7;graphs.py:load_graphs:9
100.500\tstart.py:main:1;model_runner.py:capture_model_helper:1
101.000\tstart.py:main:1
"""


def test_each_sample_inside_the_frame_lasts_until_the_next(tmp_path):
    path = tmp_path / "stacks-7.txt"
    path.write_text(_SAMPLES)
    lines = summary.profile(path, frames=1, within="model_runner.py:capture_model", top=5)
    assert lines[0] == "0.500 s inside model_runner.py:capture_model"
    assert lines[1].split() == ["0.300", "s", "__init__.py:collect:1"]
    assert lines[2].split() == ["0.200", "s", "graphs.py:load_graphs:9"]
    # capture_model_helper is another function; a bare function name matches in any file.
    assert summary.profile(path, 1, "capture_model", 5)[0].startswith("0.500 s")


def test_a_frame_never_entered_gives_no_profile(tmp_path):
    path = tmp_path / "stacks-7.txt"
    path.write_text(_SAMPLES)
    assert summary.profile(path, 1, "capture", 5) == []


def test_a_fork_server_samples_nothing_itself_and_its_forked_children_do(tmp_path):
    # A thread in the fork server makes it unsafe to fork from (the engine would spawn instead).
    import os
    import subprocess
    import sys

    probe = ("import os, threading, time\n"
             "print(threading.active_count(), flush=True)\n"
             "pid = os.fork()\n"
             "if pid == 0:\n"
             "    time.sleep(0.3); os._exit(0)\n"
             "os.waitpid(pid, 0); print(pid)\n")
    env = dict(os.environ, PYTHONPATH=str(_PATH.parent), FOUNDRY_STACK_SAMPLES=str(tmp_path / "s"),
               FOUNDRY_STACK_INTERVAL="0.05", FOUNDRY_FORK_SERVER_STATUS=str(tmp_path / "status.json"))
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    threads, child = out.stdout.split()
    assert threads == "1"
    assert [p.name for p in (tmp_path / "s").glob("stacks-*")] == [f"stacks-{child}.txt"]


def _run_sampled(tmp_path, code: str, **env: str) -> str:
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(_PATH.parent), FOUNDRY_STACK_SAMPLES=str(tmp_path / "s"), **env)
    env.pop("FOUNDRY_FORK_SERVER_STATUS", None)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout


def test_each_long_collection_is_written_by_the_process_that_ran_it(tmp_path):
    code = ("import gc, os\n"
            "gc.collect()\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    gc.freeze(); gc.collect(); os._exit(0)\n"
            "os.waitpid(pid, 0); print(os.getpid(), pid)\n")
    parent, child = _run_sampled(tmp_path, code, FOUNDRY_GC_PAUSE_MS="0").split()
    mine = (tmp_path / "s" / f"gc-{parent}.txt").read_text().splitlines()
    theirs = (tmp_path / "s" / f"gc-{child}.txt").read_text().splitlines()
    assert any(line.split("\t")[1] == "gen=2" and line.endswith("frozen=0") for line in mine)
    assert not any(line.endswith("frozen=0") for line in theirs if "gen=2" in line)  # after its freeze
    assert any("gen=2" in line for line in theirs)


def test_short_collections_are_not_written(tmp_path):
    _run_sampled(tmp_path, "import gc; gc.collect()", FOUNDRY_GC_PAUSE_MS="60000")
    assert not list((tmp_path / "s").glob("gc-*"))


def test_the_longest_collections_come_first_with_their_times(tmp_path):
    path = tmp_path / "gc-9.txt"
    path.write_text("100.000\tgen=0\t0.012\tcollected=3\tfrozen=0\n"
                    "101.500\tgen=2\t0.604\tcollected=10\tfrozen=0\n"
                    "torn line\n")
    lines = summary.gc_pauses(path, top=1)
    assert lines[0] == "2 garbage collections, 0.616 s in all"
    assert lines[1].split() == ["0.604", "s", "at", "101.500", "gen=2", "collected=10", "frozen=0"]
    assert len(lines) == 2

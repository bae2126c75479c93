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
    assert [p.name for p in (tmp_path / "s").iterdir()] == [f"stacks-{child}.txt"]

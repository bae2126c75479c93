"""scripts/stack_sampler/sitecustomize.py with FOUNDRY_STACK_DUMPS: every thread dumped without the
GIL, and a sampled process that forks still has children that run and exit."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_DIR = Path(__file__).resolve().parents[2] / "scripts" / "stack_sampler"

_FORKS = textwrap.dedent("""
    import os, sys, time
    pid = os.fork()
    if pid == 0:
        time.sleep(0.3)
        sys.exit(0)  # the interpreter's exit cancels the watchdog too
    _, status = os.waitpid(pid, 0)
    time.sleep(0.2)
    print("child", os.waitstatus_to_exitcode(status))
""")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_sampled_process_that_forks_has_a_child_that_runs_dumps_and_exits(tmp_path):
    script = tmp_path / "forks.py"
    script.write_text(_FORKS)
    out = tmp_path / "samples"
    env = {**os.environ, "FOUNDRY_STACK_SAMPLES": str(out), "FOUNDRY_STACK_DUMPS": "0.05",
           "PYTHONPATH": f"{_DIR}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("FOUNDRY_FORK_SERVER_STATUS", None)
    # The watchdog's lock held across the fork would hang the child at its first re-arm or at exit.
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "child 0"
    dumps = sorted(out.glob("dumps-*.txt"))
    assert len(dumps) == 2  # the parent's and the child's
    for path in dumps:
        text = path.read_text()
        assert text.startswith("# pid ") and "Thread 0x" in text and "(most recent call first)" in text

"""Crash safety of SAVE's publication protocol (foundry_core.graphs._publish), without a GPU.

A child process builds a synthetic archive (archive_factory) in a staging directory named as
``save_graphs`` names it, then publishes it with the real ``graphs._publish``. Every file write,
rename and directory fsync is followed by a pause (FOUNDRY_TEST_STEP_DELAY) so that kills and
races land between steps rather than only before or after them.

(a) The child is killed with SIGKILL at stratified random times: the final path must then be absent
    or hold a complete archive (the previous one or the new one, byte for byte) that verify and the
    loader's readers accept; leftover dot-directories must not change what the loader reads.
(b) Two children publish different archives to the same final path at the same moment: the result
    must be exactly one of the two archives, never a mix.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import archive_factory as af
from foundry_core.graphs import check_allocations, open_archive
from foundry_core.inspect import payload_dump
from foundry_core.verify import FAIL, verify_archive

STEP_DELAY = 0.03          # seconds after each file, rename and fsync in the child
# More with FOUNDRY_CRASH_TRIALS / FOUNDRY_RACE_ROUNDS (and FOUNDRY_CRASH_SEED to replay a run).
KILL_TRIALS = max(20, int(os.environ.get("FOUNDRY_CRASH_TRIALS", "24")) // 2 * 2)  # half over an old archive
RACE_ROUNDS = int(os.environ.get("FOUNDRY_RACE_ROUNDS", "16"))
NEW = ("new-1", "new-2", "new-3")
OLD = ("old-1", "old-2", "old-3")
RACER_A = ("a-1", "a-2", "a-3")
RACER_B = ("b-1", "b-2", "b-3", "b-4")

WORKER = r"""
import os, sys, threading, time
from pathlib import Path
import archive_factory as af
from foundry_core import graphs

mode, final, names = sys.argv[1], Path(sys.argv[2]), tuple(sys.argv[3].split(","))
delay = float(os.environ.get("FOUNDRY_TEST_STEP_DELAY", "0"))

def pause(_path=None):
    if delay:
        time.sleep(delay)

# The real _publish, with a pause after each of its renames and directory fsyncs.
_rename, _fsync_dir = os.rename, graphs._fsync_dir
def slow_rename(src, dst):
    _rename(src, dst)
    pause()
def slow_fsync_dir(path):
    _fsync_dir(path)
    pause()
os.rename = slow_rename
graphs._fsync_dir = slow_fsync_dir

staging = final.parent / f".{final.name}.staging.{os.getpid()}.{threading.get_ident()}"  # as save_graphs
staging.mkdir()
print("staging", flush=True)
af.write_archive_files(staging, names, after_each=pause)
if mode == "race":
    print("staged", flush=True)
    start = float(sys.stdin.readline())
    while time.time() < start:
        pass
try:
    graphs._publish(staging, final)
except BaseException as exc:
    print(f"error {type(exc).__name__}: {exc}", flush=True)
    sys.exit(3)
print("published", flush=True)
"""


def _env() -> dict[str, str]:
    here = Path(__file__).resolve().parent
    path = os.pathsep.join(p for p in (str(here), str(here.parents[1]), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "FOUNDRY_TEST_STEP_DELAY": str(STEP_DELAY)}


def _spawn(mode: str, final: Path, names: tuple[str, ...]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WORKER, mode, str(final), ",".join(names)], env=_env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _expect_line(proc: subprocess.Popen, want: str) -> None:
    line = proc.stdout.readline().strip()  # "" when the worker died
    if line != want:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"worker said {line!r}, expected {want!r}\n{err[-3000:]}")


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> dict[tuple[str, ...], dict[str, bytes]]:
    """The exact files of each archive the workers write (the factory is deterministic)."""
    root = tmp_path_factory.mktemp("references")
    return {names: af.archive_contents(af.make_archive(root / names[0], names)) for names in (NEW, OLD, RACER_A,
                                                                                              RACER_B)}


def _loader_view(final: Path) -> tuple[list[str], list[str]]:
    """What LOAD's readers see at `final`: the manifest's graph names and the payload's."""
    manifest_path, manifest = open_archive(final, check_environment=False)
    check_allocations(manifest_path.parent, manifest)  # reads the allocation log
    payload = payload_dump(manifest_path.parent / manifest["payload"])
    return [g["name"] for g in manifest["graphs"]], [m["name"] for m in payload["members"]]


def _which(final: Path, references: dict, allowed: tuple[tuple[str, ...], ...]) -> tuple[str, ...]:
    """The archive at `final`, which must be exactly one of `allowed` and pass verify and the loader."""
    failed = {c.name: c.detail for c in verify_archive(final) if c.status == FAIL}
    assert not failed, f"verify refuses the published archive: {failed}"
    contents = af.archive_contents(final)
    matches = [names for names in allowed if contents == references[names]]
    assert len(matches) == 1, (f"{final} is none of the expected archives: files {sorted(contents)}, graphs "
                               f"{_loader_view(final)}")
    listed, stored = _loader_view(final)
    assert listed == stored == list(matches[0])
    return matches[0]


def _trash(directories: list[Path]) -> None:
    """Overwrites every file under the given directories with garbage."""
    for d in directories:
        for dirpath, _dirs, files in os.walk(d):
            for f in files:
                p = Path(dirpath, f)
                if not p.is_symlink():
                    p.write_bytes(b"garbage")


def test_save_killed_at_random_points_never_leaves_an_accepted_partial_archive(tmp_path, references):
    started = time.monotonic()
    # How long a whole publication takes once the child is running (after its imports).
    final = tmp_path / "calibrate" / "arch"
    final.parent.mkdir()
    af.make_archive(final, OLD)
    proc = _spawn("save", final, NEW)
    _expect_line(proc, "staging")
    t0 = time.monotonic()
    _expect_line(proc, "published")
    window = time.monotonic() - t0
    assert proc.wait(timeout=20) == 0
    assert _which(final, references, (NEW,)) == NEW

    seed = int(os.environ.get("FOUNDRY_CRASH_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    outcomes: Counter = Counter()
    with_leftovers = 0
    per_group = KILL_TRIALS // 2
    for trial in range(KILL_TRIALS):
        over_old = trial % 2 == 1
        d = tmp_path / f"trial{trial}"
        d.mkdir()
        final = d / "arch"
        if over_old:
            af.make_archive(final, OLD)
        proc = _spawn("save", final, NEW)
        _expect_line(proc, "staging")
        # Stratified over the publication window (and a little past it).
        kill_at = ((trial // 2) + rng.random()) / per_group * window * 1.15
        time.sleep(kill_at)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=20)

        assert {p.name for p in d.iterdir() if not p.name.startswith(".")} <= {"arch"}, sorted(os.listdir(d))
        if not final.exists():
            outcome = "absent"
            with pytest.raises(Exception):  # noqa: B017 - nothing there to load
                open_archive(final, check_environment=False)
        else:
            names = _which(final, references, (NEW, OLD) if over_old else (NEW,))
            outcome = "new" if names == NEW else "old"
            leftovers = [p for p in d.iterdir() if p.name.startswith(".")]
            if leftovers:
                # The loader reads only the final directory: trashing the leftovers changes nothing.
                with_leftovers += 1
                before = _loader_view(final)
                _trash(leftovers)
                assert _loader_view(final) == before
                assert _which(final, references, (names,)) == names
        outcomes[(over_old, outcome)] += 1

    elapsed = time.monotonic() - started
    print(f"\ncrash safety: seed {seed}, publication window {window:.2f} s, {KILL_TRIALS} kills in {elapsed:.1f} s: "
          + ", ".join(f"{'over an old archive' if o else 'fresh'} -> {k}: {n}"
                      for (o, k), n in sorted(outcomes.items()))
          + f"; {with_leftovers} accepted archives had leftover dot-directories beside them")
    assert sum(outcomes.values()) == KILL_TRIALS
    # Not vacuous: kills landed before publication and after it.
    assert outcomes[(False, "absent")] + outcomes[(True, "old")] + outcomes[(True, "absent")] > 0, outcomes
    assert outcomes[(False, "new")] + outcomes[(True, "new")] > 0, outcomes


def test_concurrent_publications_never_mix(tmp_path, references):
    started = time.monotonic()
    rng = random.Random(int(os.environ.get("FOUNDRY_CRASH_SEED", "11")))
    winners: Counter = Counter()
    loser_errors: Counter = Counter()
    leftovers = 0
    for rnd in range(RACE_ROUNDS):
        d = tmp_path / f"round{rnd}"
        d.mkdir()
        final = d / "arch"
        if rnd % 2:
            af.make_archive(final, OLD)
        racers = {RACER_A: _spawn("race", final, RACER_A), RACER_B: _spawn("race", final, RACER_B)}
        for proc in racers.values():
            _expect_line(proc, "staging")
            _expect_line(proc, "staged")
        start = time.time() + 0.05
        for proc in racers.values():
            proc.stdin.write(f"{start + rng.choice([0, 0, 0.001, 0.003, 0.01, 0.03])}\n")
            proc.stdin.flush()
        results = {}
        for names, proc in racers.items():
            out, err = proc.communicate(timeout=20)
            results[names] = (proc.returncode, out.strip().splitlines()[-1] if out.strip() else err[-500:])
            assert proc.returncode in (0, 3), f"racer {names[0]} died: {proc.returncode}\n{err[-3000:]}"
        assert any(rc == 0 for rc, _ in results.values()), f"neither racer published: {results}"
        assert final.exists(), f"both racers ran, yet {final} does not exist: {results}"
        winner = _which(final, references, (RACER_A, RACER_B))
        winners[(bool(rnd % 2), winner[0][0], tuple(rc for rc, _ in results.values()))] += 1
        for rc, line in results.values():
            if rc != 0:
                loser_errors[line.split(":")[0].removeprefix("error ")] += 1
        leftovers += sum(1 for p in d.iterdir() if p.name.startswith("."))

    print(f"\nconcurrent publication: {RACE_ROUNDS} rounds in {time.monotonic() - started:.1f} s; "
          f"(over an old archive, winner, exit codes A/B): {dict(winners)}; losers raised {dict(loser_errors)}; "
          f"{leftovers} leftover dot-directories")

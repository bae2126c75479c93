"""One server process and everything it spawns: started in a process group of its own, its merged
output read line by line and stamped on arrival, and stopped as a whole.

Stopping sends SIGINT to the group (the engines shut down cleanly on it), then SIGTERM, then
SIGKILL, each after a grace period, and returns once no process of the group is left (or, with a
warning, when SIGKILL's grace is over). The harness then waits, each up to a limit, until the port
is free and, where ``nvidia-smi`` answers, none of the group's processes holds GPU memory, and
records with the start whether they were: the next start must not pay for this one's teardown.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from foundry_core.ready.logparse import StampedLine, stamp

logger = logging.getLogger("foundry.ready")

STOP_SIGNALS: tuple[tuple[signal.Signals, float], ...] = (
    (signal.SIGINT, 20.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0))
_LINE_END = re.compile(rb"\r\n|\r|\n")


def environment(changes: Mapping[str, str | None], base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with ``changes`` applied; None removes."""
    env = dict(os.environ if base is None else base)
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


class ServerProcess:
    """A started server. ``lines`` grows as the server writes: (seconds from exec, text), '\\r'
    progress updates as lines of their own, blank lines left out. Every line also goes to
    ``log_path`` in the stamped format (logparse.py)."""

    def __init__(self, argv: list[str], env: Mapping[str, str], log_path: Path):
        self.argv = argv
        self.log_path = Path(log_path)
        self.lines: list[StampedLine] = []
        self.members: set[int] = set()  # every pid seen in the group, for the GPU-memory check
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log: IO[str] = open(self.log_path, "w", encoding="utf-8", errors="replace")
        self.t0 = time.monotonic()
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, env=dict(env), start_new_session=True)
        except OSError:
            self._log.close()
            raise
        self.pgid = self.proc.pid  # start_new_session: the server leads its own session and group
        self._reader = threading.Thread(target=self._read, name="foundry-ready-log", daemon=True)
        self._reader.start()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _read(self) -> None:
        fd = self.proc.stdout.fileno()  # type: ignore[union-attr]
        pending = b""
        while True:
            chunk = os.read(fd, 1 << 16)
            now = self.elapsed()
            if not chunk:
                break
            parts = _LINE_END.split(pending + chunk)
            pending = parts.pop()  # the unterminated rest waits for its end
            for part in parts:
                self._add(now, part)
        if pending:
            self._add(self.elapsed(), pending)
        self._log.close()

    def _add(self, seconds: float, raw: bytes) -> None:
        text = raw.decode("utf-8", errors="replace")
        if not text.strip():
            return
        self.lines.append((seconds, text))
        self._log.write(stamp(seconds, text) + "\n")
        self._log.flush()

    def stop(self) -> str:
        """Stops the whole group; returns the signal that ended it ("exited" if it had ended)."""
        self.members |= group_members(self.pgid)
        ended_by = "exited"
        for sig, grace in STOP_SIGNALS:
            if not self._group_alive():
                break
            ended_by = sig.name
            try:
                os.killpg(self.pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + grace
            while self._group_alive() and time.monotonic() < deadline:
                self.members |= group_members(self.pgid)
                time.sleep(0.1)
        if self._group_alive():
            logger.warning("processes of group %d are still alive after SIGKILL: %s", self.pgid,
                           sorted(group_members(self.pgid)))
        self._reader.join(timeout=10)
        return ended_by

    def _group_alive(self) -> bool:
        self.proc.poll()  # reaps the leader once it exited
        return bool(group_members(self.pgid)) or self.proc.returncode is None


def group_members(pgid: int) -> set[int]:
    """Live processes of group ``pgid`` (zombies excluded: a container's init may be slow to reap
    them, and they hold no memory)."""
    found = set()
    proc = Path("/proc")
    if not proc.is_dir():  # not Linux: ask the kernel whether the group has anyone left
        try:
            os.killpg(pgid, 0)
            return {pgid}
        except (ProcessLookupError, PermissionError):
            return set()
    for entry in proc.iterdir():
        stat = process_stat(entry)
        if stat is not None and int(stat[1][2]) == pgid and stat[1][0] != "Z":
            found.add(int(entry.name))
    return found


def process_stat(entry: Path) -> tuple[str, list[str]] | None:
    """(comm, the fields after it: state, ppid, pgrp, ...) of ``/proc/<pid>``; None for an entry
    that is not a process or one that has gone."""
    if not entry.name.isdigit():
        return None
    try:
        head, _, rest = (entry / "stat").read_text().rpartition(")")
    except OSError:
        return None
    return head.partition("(")[2], rest.split()


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) != 0


def wait_port_free(port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not port_free(port):
        if time.monotonic() > deadline:
            logger.warning("port %d is still in use %.0f s after its server stopped; the next start may fail to listen "
                           "on it (see what holds it: ss -ltnp)", port, timeout)
            return False
        time.sleep(0.2)
    return True


def gpu_holders(pids: set[int]) -> set[int] | None:
    """Which of ``pids`` hold GPU memory now, by ``nvidia-smi``; None where it cannot tell."""
    smi = shutil.which("nvidia-smi")
    if not smi or not pids:
        return None if not smi else set()
    try:
        out = subprocess.run([smi, "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    listed = {int(x) for x in out.stdout.split() if x.strip().isdigit()}
    return listed & pids


def wait_gpu_released(pids: set[int], timeout: float) -> bool | None:
    """Waits until none of ``pids`` holds GPU memory; None where nvidia-smi cannot tell."""
    deadline = time.monotonic() + timeout
    while True:
        holders = gpu_holders(pids)
        if holders is None:
            return None
        if not holders:
            return True
        if time.monotonic() > deadline:
            logger.warning("processes %s still hold GPU memory %.0f s after their server stopped", sorted(holders),
                           timeout)
            return False
        time.sleep(0.5)

"""With FOUNDRY_FORK_PRIVATE_HEAP=1 a child forked from the fork server copies the heap it
inherited up front, on a thread (foundry_core/engine/fork_server/private_heap.py): afterwards its
first pass over inherited objects takes no copy-on-write faults, and a sparse mapping stays
unfilled. By default the pages stay shared."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap

import pytest

from foundry_core.engine.fork_server import client, private_heap

MAPS = """\
00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/python3
00652000-00653000 rw-p 00052000 08:02 173521      /usr/bin/python3
01e5a000-02b20000 rw-p 00000000 00:00 0           [heap]
7f2c10000000-7f2c14000000 rw-p 00000000 00:00 0
7f2c14000000-7f2c18000000 ---p 00000000 00:00 0
7ffc2f0d0000-7ffc2f0f1000 rw-p 00000000 00:00 0   [stack]
7ffc2f1b5000-7ffc2f1b7000 r-xp 00000000 00:00 0   [vdso]
"""


def test_only_private_writable_anonymous_mappings_are_noted():
    assert private_heap.inherited(MAPS) == [(0x01E5A000, 0x02B20000), (0x7F2C10000000, 0x7F2C14000000)]
    assert private_heap.MapsLine.parse("7f00-7f10 rw-p 00000000 00:00 0 [stack:1234]").private_anon_writable is False
    assert private_heap.MapsLine.parse("7f00-7f10 rw-p 00000000 00:00 0 [stackish]").private_anon_writable is True


def _entries(*top_bytes: int) -> bytes:
    """Pagemap entries whose top byte (present 0x80, exclusive 0x01) is each of ``top_bytes``."""
    return b"".join((0x1234 | b << 56).to_bytes(8, "little") for b in top_bytes)


def test_only_pages_present_and_still_shared_are_copied():
    page = private_heap.PAGE
    # shared, shared, exclusive (written since the fork), absent (never touched), shared, swapped
    entries = _entries(0x80, 0x80, 0x81, 0x00, 0x80, 0x40)
    assert list(private_heap.shared_runs(entries, 0x10000)) == [(0x10000, 2 * page), (0x10000 + 4 * page, page)]


def test_pieces_cover_each_range():
    assert list(private_heap.pieces([(0, 10), (20, 25)], size=4)) == [(0, 4), (4, 4), (8, 2), (20, 4), (24, 1)]
    assert private_heap.PIECE <= 4 << 20  # each call holds the mapping lock the main thread's mmap waits for


class _FakeMadvise:
    def __init__(self, codes, supported=True):
        self.codes, self.calls, self.supported = list(codes), [], supported

    def populate_write(self, address, length):
        if (address, length) == (0, 0):
            return 0 if self.supported else errno.EINVAL
        self.calls.append((address, length))
        return self.codes.pop(0) if self.codes else 0


def _pagemap(tmp_path, start_page: int, top_bytes: list[int]):
    path = tmp_path / "pagemap"
    path.write_bytes(b"\0" * 8 * start_page + _entries(*top_bytes))
    return str(path)


def test_a_kernel_without_the_call_is_told_by_the_probe(tmp_path):
    fake = _FakeMadvise([], supported=False)
    out = private_heap.populate([(0, private_heap.PAGE)], fake, _pagemap(tmp_path, 0, [0x80]))
    assert "5.14" in out.stopped and out.copied == 0 and fake.calls == []


def test_a_changed_range_is_skipped_and_enomem_stops(tmp_path):
    page = private_heap.PAGE
    ranges = [(0, 3 * page)]
    pagemap = _pagemap(tmp_path, 0, [0x80, 0x00, 0x80])
    out = private_heap.populate(ranges, _FakeMadvise([errno.EINVAL, 0]), pagemap, max_bytes=1 << 30)
    assert out.stopped is None and out.copied == page
    out = private_heap.populate(ranges, _FakeMadvise([errno.ENOMEM]), pagemap, max_bytes=1 << 30)
    assert out.stopped == "ENOMEM" and out.copied == 0


def test_the_cap_and_a_fork_stop_the_copy(tmp_path):
    page = private_heap.PAGE
    pagemap = _pagemap(tmp_path, 0, [0x80, 0x00, 0x80])
    out = private_heap.populate([(0, 3 * page)], _FakeMadvise([]), pagemap, max_bytes=page)
    assert out.copied == page and "cap" in out.stopped
    stop = private_heap.threading.Event()
    stop.set()
    out = private_heap.populate([(0, 3 * page)], _FakeMadvise([]), pagemap, stop=stop, max_bytes=1 << 30)
    assert out.copied == 0 and out.stopped == "the child forked"


def test_an_unreadable_pagemap_copies_nothing_and_says_why(tmp_path):
    out = private_heap.populate([(0, private_heap.PAGE)], _FakeMadvise([]), str(tmp_path / "missing"))
    assert out.copied == 0 and "pagemap" in out.stopped


def test_the_cgroup_headroom(tmp_path):
    (tmp_path / "memory.max").write_text("1000\n")
    (tmp_path / "memory.current").write_text("400\n")
    assert private_heap.headroom(tmp_path) == 600
    (tmp_path / "memory.max").write_text("max\n")
    assert private_heap.headroom(tmp_path) is None
    assert private_heap.headroom(tmp_path / "absent") is None


@pytest.mark.parametrize("value, expected", [(None, False), ("1", True), (" On ", True), ("yes", True), ("0", False),
                                             ("Off", False), ("no", False)])
def test_the_switch(value, expected):
    assert private_heap.wanted({} if value is None else {private_heap.ENV: value}) is expected


# A parent with a large import-like heap forks a child through the fork server's child target
# (client.InEnviron), which starts the copy unless switched off; the child then walks the
# inherited objects and reports its page faults, and how much a sparse mapping grew.
CHILD = textwrap.dedent("""
    import ctypes, json, mmap, os, resource, sys, threading
    from foundry_core.engine.fork_server import client, private_heap

    heap = [{"n": i, "s": str(i)} for i in range(400_000)]  # ~100 MiB of objects, as imports leave
    sparse = mmap.mmap(-1, 1 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # 1 GiB, one page touched
    sparse[0] = 1
    sparse_at = ctypes.addressof(ctypes.c_char.from_buffer(sparse))

    def present_pages(address, length):
        with open("/proc/self/pagemap", "rb") as f:
            f.seek(address // private_heap.PAGE * 8)
            entries = f.read(length // private_heap.PAGE * 8)
        return sum(1 for b in entries[7::8] if b & 0x80)

    def child():
        thread = next((t for t in threading.enumerate() if t.name == "foundry-heap-copy"), None)
        if thread is not None:
            thread.join()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        total = sum(d["n"] for d in heap)  # touches every inherited object's reference count
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        outcome = private_heap.last_outcome()
        print(json.dumps({"faults": faults, "sparse_pages": present_pages(sparse_at, 1 << 30),
                          "copied": thread is not None, "outcome": outcome and outcome.__dict__}))
        sys.stdout.flush()

    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            client.InEnviron(dict(os.environ), child)()
            code = 0
        finally:
            os._exit(code)
    sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
""")


def _child(tmp_path, **env) -> dict:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, **env})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_forked_child_copies_its_inherited_heap_up_front(tmp_path):
    shared = _child(tmp_path)  # off by default
    assert shared["copied"] is False and shared["faults"] > 5000  # a copy-on-write fault per page written
    copied = _child(tmp_path, FOUNDRY_FORK_PRIVATE_HEAP="1")
    if copied["outcome"] and copied["outcome"]["stopped"]:
        pytest.skip(copied["outcome"]["stopped"])
    assert copied["copied"] is True and copied["outcome"]["copied"] > 50 << 20
    assert copied["faults"] < shared["faults"] / 10, (copied, shared)
    assert copied["sparse_pages"] == shared["sparse_pages"] > 0  # the untouched reservation was not filled


def test_the_child_target_starts_the_copy_only_when_switched_on(monkeypatch):
    started = []
    monkeypatch.setattr(private_heap, "start", lambda: started.append(True))
    here = dict(os.environ)
    try:  # the target takes on the environment it is given, as a child does
        client.InEnviron({**here, "FOUNDRY_FORK_GC_FREEZE": "0"}, lambda: None)()  # off by default
        client.InEnviron({**here, "FOUNDRY_FORK_PRIVATE_HEAP": "1", "FOUNDRY_FORK_GC_FREEZE": "0"}, lambda: None)()
    finally:
        os.environ.clear()
        os.environ.update(here)
    assert started == [True]


def test_what_the_thread_did_is_logged_and_a_copy_cut_short_is_a_warning(caplog):
    caplog.set_level("INFO", logger="foundry.fork_server")
    private_heap._say(private_heap.Outcome(copied=366 << 20, seconds=0.32))
    private_heap._say(private_heap.Outcome(copied=0, seconds=0.0, stopped="this kernel has no MADV_POPULATE_WRITE"))
    done, cut = caplog.records
    assert done.levelname == "INFO" and "copied 366 MiB" in done.getMessage()
    assert cut.levelname == "WARNING" and "no MADV_POPULATE_WRITE" in cut.getMessage()
    assert "FOUNDRY_FORK_PRIVATE_HEAP=0" in cut.getMessage()


def test_a_copy_that_cannot_start_says_so_and_does_not_raise(monkeypatch, caplog):
    def refused(*args, **kwargs):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(private_heap.threading, "Thread", refused)
    monkeypatch.setattr(private_heap, "_fork_hook", True)  # no at-fork hook left in this test process
    assert private_heap.start() is None
    assert "did not start: RuntimeError" in caplog.text

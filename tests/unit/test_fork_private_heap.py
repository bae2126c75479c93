"""A child forked from the fork server copies the heap it inherited up front, on a thread
(foundry_core/engine/fork_server/private_heap.py): afterwards its first pass over inherited
objects takes no copy-on-write faults, a sparse mapping stays unfilled, and the switch leaves the
pages shared."""

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


def test_a_mapping_is_copied_only_when_half_resident_and_within_the_cap():
    ranges = [(0, 100), (100, 300), (300, 400)]
    assert private_heap.worth_copying(ranges, {0: 60, 100: 40, 300: 100}) == [(0, 100), (300, 400)]
    assert private_heap.worth_copying(ranges, {0: 100, 100: 200, 300: 100}, max_bytes=300) == [(0, 100), (100, 300)]


def test_resident_bytes_are_read_from_smaps():
    smaps = ["01e5a000-02b20000 rw-p 00000000 00:00 0 [heap]\n", "Size:  13080 kB\n", "Rss:  12000 kB\n",
             "7f2c10000000-7f2c14000000 rw-p 00000000 00:00 0\n", "Rss:  4 kB\n", "VmFlags: rd wr mr mw me ac\n"]
    assert private_heap.resident_bytes(smaps, {0x01E5A000}) == {0x01E5A000: 12000 * 1024}


def test_chunks_cover_each_range():
    assert list(private_heap.chunks([(0, 10), (20, 25)], size=4)) == [(0, 4), (4, 4), (8, 2), (20, 4), (24, 1)]


class _FakeMadvise:
    def __init__(self, codes):
        self.codes, self.calls = list(codes), []

    def populate_write(self, address, length):
        self.calls.append((address, length))
        return self.codes.pop(0) if self.codes else 0


def test_a_kernel_without_the_call_stops_at_once_and_a_changed_range_is_skipped(tmp_path):
    big = 3 * private_heap.CHUNK
    smaps = tmp_path / "smaps"
    smaps.write_text(f"1000-{0x1000 + big:x} rw-p 0 00:00 0\nRss: {big // 1024} kB\n")
    old_kernel = _FakeMadvise([errno.EINVAL])
    out = private_heap.copy([(0x1000, 0x1000 + big)], old_kernel, str(smaps))
    assert out.stopped and "5.14" in out.stopped and out.copied == 0 and len(old_kernel.calls) == 1
    unmapped_since = _FakeMadvise([0, errno.ENOMEM, 0])
    out = private_heap.copy([(0x1000, 0x1000 + big)], unmapped_since, str(smaps))
    assert out.stopped is None and out.copied == 2 * private_heap.CHUNK and len(unmapped_since.calls) == 3


def test_unreadable_residency_copies_nothing_and_says_why(tmp_path):
    out = private_heap.copy([(0x1000, 0x2000)], _FakeMadvise([]), str(tmp_path / "missing"))
    assert out.copied == 0 and "smaps" in out.stopped


@pytest.mark.parametrize("value, expected", [(None, True), ("1", True), ("0", False), ("Off", False), ("no", False)])
def test_the_switch(value, expected):
    assert private_heap.wanted({} if value is None else {private_heap.ENV: value}) is expected


# A parent with a large import-like heap forks a child through the fork server's child target
# (client.InEnviron), which starts the copy unless switched off; the child then walks the
# inherited objects and reports its page faults, and how much a sparse mapping grew.
CHILD = textwrap.dedent("""
    import json, mmap, os, resource, sys, time
    from foundry_core.engine.fork_server import client, private_heap

    heap = [{"n": i, "s": str(i)} for i in range(400_000)]  # ~100 MiB of objects, as imports leave
    sparse = mmap.mmap(-1, 1 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # 1 GiB, one page touched
    sparse[0] = 1

    def rss_of_sparse():
        start = None
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(" ", 1)[0]
                if "-" in head and not head.endswith(":"):
                    lo, hi = (int(x, 16) for x in head.split("-"))
                    start = lo if hi - lo == 1 << 30 else None
                elif start is not None and line.startswith("Rss:"):
                    return int(line.split()[1])

    def child():
        thread = next((t for t in __import__("threading").enumerate() if t.name == "foundry-heap-copy"), None)
        if thread is not None:
            thread.join()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        total = sum(d["n"] for d in heap)  # touches every inherited object's reference count
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        outcome = private_heap.RESULT[0].__dict__ if private_heap.RESULT else None
        print(json.dumps({"faults": faults, "sparse_kib": rss_of_sparse(), "copied": thread is not None,
                          "outcome": outcome}))
        sys.stdout.flush()

    pid = os.fork()
    if pid == 0:
        try:
            client.InEnviron(dict(os.environ), child)()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
""")


def _child(tmp_path, **env) -> dict:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, **env})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_forked_child_copies_its_inherited_heap_up_front(tmp_path):
    shared = _child(tmp_path, FOUNDRY_FORK_PRIVATE_HEAP="0")
    assert shared["copied"] is False and shared["faults"] > 5000  # a copy-on-write fault per page written
    copied = _child(tmp_path)
    if copied["outcome"] and copied["outcome"]["stopped"]:
        pytest.skip(copied["outcome"]["stopped"])
    assert copied["copied"] is True and copied["outcome"]["copied"] > 50 << 20
    assert copied["faults"] < shared["faults"] / 10, (copied, shared)
    assert 0 < copied["sparse_kib"] < 1024  # the sparse reservation was left as it was


def test_the_child_target_starts_no_copy_when_switched_off(monkeypatch):
    started = []
    monkeypatch.setattr(private_heap, "start", lambda: started.append(True))
    here = dict(os.environ)
    try:  # the target takes on the environment it is given, as a child does
        client.InEnviron({**here, "FOUNDRY_FORK_PRIVATE_HEAP": "off", "FOUNDRY_FORK_GC_FREEZE": "0"}, lambda: None)()
        client.InEnviron({**here, "FOUNDRY_FORK_GC_FREEZE": "0"}, lambda: None)()
    finally:
        os.environ.clear()
        os.environ.update(here)
    assert started == [True]

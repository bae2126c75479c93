"""libfoundry.so's NCCL entry points, without a GPU: a stand-in libnccl (built here) is opened the
way vLLM's pynccl opens the real one (ctypes, so dlsym with a library handle); the lookup must
answer with Foundry's entry point, which must forward every argument to the library's own."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import pytest

from foundry_core.preload import preload_environment

FAKE_NCCL = r"""
#include <stddef.h>
static size_t last_count;
static int last_dtype, last_op, calls;
static void* last_comm;
int ncclAllReduce(const void* s, void* r, size_t n, int dt, int op, void* comm, void* stream) {
  last_count = n; last_dtype = dt; last_op = op; last_comm = comm; ++calls;
  return 0;
}
typedef struct { char internal[128]; } ncclUniqueId;
int ncclCommInitRank(void** comm, int nranks, ncclUniqueId id, int rank) {
  *comm = (void*)(0x1000 + (size_t)rank + (size_t)id.internal[0]);
  return nranks == 2 ? 0 : 4;
}
size_t fake_last_count(void) { return last_count; }
int fake_last(int which) { return which == 0 ? last_dtype : which == 1 ? last_op : calls; }
void* fake_last_comm(void) { return last_comm; }
"""

PROGRAM = textwrap.dedent("""
    import ctypes, json, sys
    lib = ctypes.CDLL(sys.argv[1])
    foundry = ctypes.CDLL(sys.argv[2])
    addr = lambda f: ctypes.cast(f, ctypes.c_void_p).value
    class UniqueId(ctypes.Structure):  # passed by value, as pynccl does
        _fields_ = [("internal", ctypes.c_byte * 128)]
    uid = UniqueId()
    uid.internal[0] = 5
    comm = ctypes.c_void_p()
    init = lib.ncclCommInitRank
    init.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int]
    rc_init = init(ctypes.byref(comm), 2, uid, 1)
    ar = lib.ncclAllReduce
    ar.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                   ctypes.c_void_p, ctypes.c_void_p]
    rc = ar(0x10, 0x20, 123456789, 9, 2, comm, None)
    lib.fake_last_count.restype = ctypes.c_size_t
    lib.fake_last_comm.restype = ctypes.c_void_p
    print(json.dumps({
        "interposed": addr(lib.ncclAllReduce) == addr(foundry.ncclAllReduce),
        "rc_init": rc_init, "comm": comm.value, "rc": rc, "count": lib.fake_last_count(),
        "dtype": lib.fake_last(0), "op": lib.fake_last(1), "calls": lib.fake_last(2), "seen_comm": lib.fake_last_comm()}))
""")


@pytest.fixture(scope="module")
def fake_nccl(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the stand-in libnccl")
    d = tmp_path_factory.mktemp("nccl")
    (d / "fake_nccl.c").write_text(FAKE_NCCL)
    so = d / "libnccl.so.2"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(so), str(d / "fake_nccl.c")], check=True)
    return so


def test_dlsym_answers_nccl_with_foundry_entry_points_that_forward_every_argument(fake_nccl):
    env = preload_environment()
    library = env["LD_PRELOAD"].split()[0]
    proc = subprocess.run([sys.executable, "-c", PROGRAM, str(fake_nccl), library], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["interposed"], "ctypes' lookup of ncclAllReduce did not get libfoundry.so's entry point"
    assert out["rc_init"] == 0 and out["comm"] == 0x1000 + 1 + 5
    assert out["rc"] == 0 and out["calls"] == 1
    assert (out["count"], out["dtype"], out["op"], out["seen_comm"]) == (123456789, 9, 2, out["comm"])


def test_without_the_preload_the_library_answers_for_itself(fake_nccl):
    env = {k: v for k, v in preload_environment().items() if k != "LD_PRELOAD"}
    library = preload_environment()["LD_PRELOAD"].split()[0]
    proc = subprocess.run([sys.executable, "-c", PROGRAM, str(fake_nccl), library], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not out["interposed"] and out["calls"] == 1 and out["count"] == 123456789


def test_a_second_libnccl_answers_for_itself(fake_nccl, tmp_path):
    """Communicators of one copy must never reach another: only the first copy is interposed."""
    second = tmp_path / "other" / "libnccl.so.2"
    second.parent.mkdir()
    shutil.copy(fake_nccl, second)
    program = textwrap.dedent("""
        import ctypes, json, sys
        addr = lambda f: ctypes.cast(f, ctypes.c_void_p).value
        first, second, foundry = (ctypes.CDLL(p) for p in sys.argv[1:4])
        print(json.dumps({"first": addr(first.ncclAllReduce) == addr(foundry.ncclAllReduce),
                          "second": addr(second.ncclAllReduce) == addr(foundry.ncclAllReduce)}))
    """)
    env = preload_environment()
    proc = subprocess.run([sys.executable, "-c", program, str(fake_nccl), str(second), env["LD_PRELOAD"].split()[0]],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"first": True, "second": False}

"""Tensor parallel on two GPUs: graphs with an NCCL all-reduce inside, SAVE on every rank, LOAD in
fresh processes; every rank's restored outputs bit-identical to its captured graphs' on the same
fresh inputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import PROGRAMS_DIR

pytestmark = pytest.mark.gpu

# NVLink multicast stays off, in this process and every child.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


def _torchrun(mode: str, directory: str, timeout: int = 180) -> list[dict]:
    from foundry_core.preload import preload_environment

    env = preload_environment(dict(os.environ, PYTHONUNBUFFERED="1", **NO_MULTICAST))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(PROGRAMS_DIR / "tp_probe.py"),
           mode, directory]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=PROGRAMS_DIR)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"tp_probe {mode} exited {proc.returncode}:\n{out[-6000:]}"
    return [json.loads((Path(directory) / f"result-{mode}-rank{rank}.json").read_text()) for rank in (0, 1)]


def _launches(launches: list[dict]) -> list[str]:
    """The kernel launches, in a comparable order."""
    return sorted(json.dumps(k, sort_keys=True) for k in launches)


def _without_comm(args: dict) -> dict:
    return {k: v for k, v in args.items() if k != "comm"}


def test_all_reduce_graphs_restore_bit_identical_on_both_ranks(tmp_path):
    if _gpus() < 2:
        pytest.skip("needs 2 GPUs")
    saved = _torchrun("save", str(tmp_path))
    for r in saved:
        assert r.get("saved"), r
    loaded = _torchrun("load", str(tmp_path))
    for s, r in zip(saved, loaded):
        print(f"\nrank {s['rank']} (NCCL {s['nccl']}): capture {s['capture_s']:.4f} s, restore {r['restore_s']:.4f} s, "
              f"{r['nccl_events']} archived events bound to NCCL's serial event")
        for name in sorted(s["replay_ms"], key=lambda n: int(n[1:])):
            print(f"  {name}: replay {s['replay_ms'][name]:.4f} ms captured, {r['replay_ms'][name]:.4f} ms restored")
        assert r["digests"] == s["digests"]
        assert r["exec_flags"] & 1, r["exec_flags"]  # instantiated with PyTorch's flags (test_graphs.py)
        for name, captured in s["launches"].items():
            restored = r["launches"][name]
            nccl = [k for k in restored if "nccl" in k["name"].lower()]
            print(f"  {name} restored NCCL launches: {nccl}")
            print(f"  {name} graph {r['shapes'][name]}, NCCL arguments restored {r['nccl_args'][name]}")
            # The restored graph has the captured one's nodes and edges, and each re-made NCCL
            # launch NCCL's own argument block (channels, where the work lies, the work itself),
            # except the address of this process's device communicator.
            assert r["shapes"][name] == s["shapes"][name], name
            assert r["nccl_args"][name] and all("work_storage" in a for a in r["nccl_args"][name]), r["nccl_args"]
            assert [_without_comm(a) for a in r["nccl_args"][name]] == [_without_comm(a) for a in s["nccl_args"][name]]
            # Every kernel launches as captured, NCCL's too: LOAD re-made them with the live
            # communicator, and NCCL chose the same kernel, grid, block, shared memory and cluster.
            assert nccl, name
            assert _launches(captured) == _launches(restored), name
        # NCCL's graph mixing (on by default) brackets every captured launch with its serial
        # event: the restored graphs name the live NCCL's, as a captured graph does.
        if os.environ.get("NCCL_GRAPH_MIXING_SUPPORT", "1") != "0":
            assert r["nccl_events"] >= 1, r
    # The ranks hold different shards, so their outputs differ: the test would catch a rank
    # restoring the other's graphs.
    assert saved[0]["digests"] != saved[1]["digests"]

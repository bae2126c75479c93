"""Runs the SAVE child, then one LOAD child per instantiation mode, and gathers their numbers."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from foundry_core.errors import FoundryError
from foundry_core.preload import preload_environment

logger = logging.getLogger("foundry")


@dataclass
class BenchConfig:
    model: dict
    sizes: list[int]
    variant: str = "eager"
    modes: list[str] = field(default_factory=lambda: ["eager"])
    threads: int = 8
    latency_sizes: list[int] = field(default_factory=list)
    reps: int = 100
    keep_archive: str | None = None


def _child(action: str, archive: Path, cfg: dict, timeout: float) -> dict:
    env = preload_environment()
    env.setdefault("PYTHONUNBUFFERED", "1")
    cmd = [sys.executable, "-m", "foundry_core.bench.worker", action, str(archive), json.dumps(cfg)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = "\n".join(proc.stderr.strip().splitlines()[-25:])
        raise FoundryError(f"the {action.upper()} process failed (exit {proc.returncode}):\n{tail}")
    return json.loads(lines[-1])


def archive_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run(cfg: BenchConfig, timeout: float = 1800) -> dict:
    """SAVE once, LOAD once per mode (each in a fresh process); returns every number measured."""
    workdir = Path(tempfile.mkdtemp(prefix="foundry-bench-"))
    archive = workdir / "archive"
    base = {"model": cfg.model, "sizes": cfg.sizes, "variant": cfg.variant, "threads": cfg.threads,
            "latency_sizes": cfg.latency_sizes, "reps": cfg.reps}
    try:
        logger.info("SAVE: capturing %d graphs", len(cfg.sizes))
        saved = _child("save", archive, base, timeout)
        loads = {}
        for mode in cfg.modes:
            logger.info("LOAD (%s)", mode)
            loads[mode] = _child("load", archive, {**base, "mode": mode, "latency_sizes": cfg.latency_sizes if mode == cfg.modes[0] else []}, timeout)
        size = archive_bytes(archive)
        images = sum(f.stat().st_size for f in (archive / "images").glob("*.fimg"))
        if cfg.keep_archive:
            shutil.copytree(archive, cfg.keep_archive, dirs_exist_ok=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return {"config": base, "modes": cfg.modes, "save": saved, "load": loads, "archive_bytes": size,
            "image_bytes": images, "identical": {m: r["digests"] == saved["digests"] for m, r in loads.items()}}


def gpu_unavailable() -> str | None:
    """Why this machine cannot run the demo, or None."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed (pip install torch, a CUDA build)"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible to PyTorch (no NVIDIA driver or GPU on this machine?)"
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        return "CUDA_VISIBLE_DEVICES is empty"
    return None

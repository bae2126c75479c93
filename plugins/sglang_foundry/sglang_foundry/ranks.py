"""The LOAD decisions every rank of a tensor-parallel SGLang start takes alike.

A rank that captures runs collectives that a restoring peer never joins: the free-memory
all-reduce of SGLang's KV profiling, the capture forwards' all-reduces. Both then wait forever.
So wherever one rank alone may find that it cannot LOAD, all ranks agree first, on the world
group's CPU (gloo) communicator, and fall back together, as vLLM's ranks do
(``vllm_foundry/ranks.py``). The points, in start-up order:

1. the KV-pool seam, before SGLang's memory profiling. A rank whose archive or determinism
   boundary failed earlier answers no here;
2. the start of the capture phase, after the KV pool (whose size a rank checks alone);
3. the end of the prefill loop's stand-in (its placements, checked per rank; the stand-in meets
   no other rank, so a rank that gives up early answers early);
4. before the decode loop (the archive's graphs loaded): SGLang's loop meets the other ranks at a
   barrier per shape, without forwards too, so every rank runs it or none;
5. after the decode loop (the graphs installed in SGLang's tables).

The first two are answered by every rank in mode load or auto, whatever its own state; the others
by every rank still loading, which after the second is every rank or none. Each rank answers each
point once. One GPU answers alone, without a collective.
"""

from __future__ import annotations

from typing import Any

from foundry_core.engine import Mode
from foundry_core.engine.agreement import all_agree
from foundry_core.errors import MismatchError

from sglang_foundry import patching

__all__ = ["Agreement", "agree", "all_ranks", "loading", "may_load", "world_size"]


def world_size(rt: Any) -> int:
    """The ranks of the start (the archive's topology; 1 before the session knows it)."""
    topology = getattr(rt.session, "topology", None)
    return int(getattr(topology, "world_size", 1) or 1)


def may_load(rt: Any) -> bool:
    """Whether some rank of this start may LOAD (mode load or auto, the same on every rank): then
    every rank answers every agreement."""
    return rt.session.requested in (Mode.LOAD, Mode.AUTO)


def loading(rt: Any) -> bool:
    """Whether this rank is still loading (it has not fallen back, and the region is open)."""
    return rt.mode is Mode.LOAD and rt.region_open


def all_ranks(rt: Any, ok: bool) -> bool:
    """True when ``ok`` holds on every rank (``ok`` is this rank's answer). Each rank must call
    it at the same point, once per decision."""
    if world_size(rt) <= 1:
        return ok
    return all_agree(ok, patching.resolve("parallel.world_group")().cpu_group)


def agree(rt: Any, ok: bool, where: str, agreement: Agreement | None = None) -> bool:
    """One agreement of a rank that may LOAD (through ``agreement`` when given): True when every
    rank loads and ``ok`` holds on each; otherwise a rank still loading falls back, saying that
    another rank does not LOAD ``where``."""
    mine = loading(rt) and ok
    if (agreement.answer(mine) if agreement is not None else all_ranks(rt, mine)):
        return True
    if mine:
        rt.fall_back(MismatchError(f"another rank does not LOAD ({where}); every rank captures"))
    return False


class Agreement:
    """One agreement point that a stretch of code with several ways out answers exactly once:
    :meth:`answer` asks the ranks the first time and returns that result after; a block that ends
    without answering (an exception on the way) answers no, so the peers do not wait forever."""

    def __init__(self, rt: Any) -> None:
        self.rt = rt
        self.result: bool | None = None

    def answer(self, ok: bool) -> bool:
        if self.result is None:
            self.result = False  # asked: a collective that raised is not asked again on the way out
            self.result = all_ranks(self.rt, ok)
        return self.result

    def __enter__(self) -> Agreement:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.result is None:
            self.answer(False)

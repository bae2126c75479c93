"""The deterministic allocation region: device memory at addresses that depend only on the
sequence of allocations, so that a fresh process making the same requests gets the same pointers.

Allocations made by the CUDA runtime (PyTorch's caching allocator, cuBLAS workspaces, ...) reach
the region only when the process runs with libfoundry.so preloaded (``foundry run -- CMD``).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import sys
from collections.abc import Iterator
from dataclasses import dataclass

from foundry_core import _native
from foundry_core.errors import StateError
from foundry_core.sizes import parse_size

logger = logging.getLogger("foundry")

LOG_KINDS = ("alloc", "free", "reserve", "unreserve", "outside", "seal", "prealloc", "claim")
# Events the application's request sequence is made of (claims and preallocations are Foundry's).
COMPARED_KINDS = frozenset({"alloc", "free", "reserve", "unreserve", "outside", "seal"})


def _ensure_context() -> None:
    """Let PyTorch create its context first when it is in use, so the region binds to its device."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.init()
        torch.cuda.synchronize()


def _require_preload() -> None:
    if not _native.lib().foundry_preload_active():
        logger.warning(
            "libfoundry.so is not preloaded: allocations made by the CUDA runtime (PyTorch, cuBLAS) "
            "will not land in the region. Start the process with `foundry run -- ...`."
        )


def set_allocation_region(base: int | str, size: int | str) -> None:
    """Reserves ``[base, base+size)`` and sends later device allocations there.

    ``base`` must be a multiple of the allocation granularity (2 MiB on current GPUs); ``size``
    is rounded up to one (``parse_size("1GB")`` is 10^9 bytes), which is logged at info. Raises
    FixedAddressError when the driver cannot place the range at ``base`` (choose another base),
    StateError when a region is already set.
    """
    _ensure_context()
    _require_preload()
    _native.call("foundry_region_set", parse_size(base), parse_size(size))


def release_allocation_region() -> None:
    """Gives the region's address range back; every allocation in it must be freed first."""
    _native.call("foundry_region_release")


def stop_allocation_region() -> None:
    """New allocations take the driver's normal path; frees of region memory still come back."""
    _native.call("foundry_region_stop")


def resume_allocation_region() -> None:
    """New allocations go to the region again."""
    _native.call("foundry_region_resume")


def get_current_alloc_offset() -> int:
    """The region cursor as an offset from its base."""
    out = ctypes.c_uint64()
    _native.call("foundry_region_get_offset", ctypes.byref(out))
    return out.value


def set_current_alloc_offset(offset: int | str) -> None:
    """Moves the cursor forward to ``offset`` and seals the space below it.

    Later allocations then no longer depend on what happened before (e.g. library bring-up whose
    allocations vary between runs). Moving backwards raises InvalidArgumentError.
    """
    _native.call("foundry_region_set_offset", parse_size(offset))


def preallocate_region(size: int | str) -> bool:
    """Maps ``size`` bytes at the cursor in one go; allocations inside are pointer bumps.

    Returns True once mapped; raises FoundryError (naming the cause) when it cannot be."""
    _native.call("foundry_region_preallocate", parse_size(size))
    return True


def free_preallocated_region() -> None:
    """Unmaps preallocated memory. Raises BusyError while allocations inside it are live."""
    _native.call("foundry_region_free_preallocated")


@dataclass(frozen=True)
class RegionInfo:
    base: int
    size: int
    active: bool
    cursor: int
    high_water: int
    live_bytes: int
    live_count: int


def region_info() -> RegionInfo:
    """The region's placement and usage. Raises StateError when no region is set."""
    vals = [ctypes.c_uint64() for _ in range(6)]
    active = ctypes.c_int()
    base, size, cursor, high, live_bytes, live_count = vals
    _native.call("foundry_region_info", *(ctypes.byref(v) for v in (base, size)), ctypes.byref(active),
                 *(ctypes.byref(v) for v in (cursor, high, live_bytes, live_count)))
    return RegionInfo(base.value, size.value, bool(active.value), cursor.value, high.value, live_bytes.value,
                      live_count.value)


def region_driver_calls() -> int:
    """Driver calls the region's allocation paths made since it was set."""
    out = ctypes.c_uint64()
    _native.call("foundry_region_driver_calls", ctypes.byref(out))
    return out.value


@contextlib.contextmanager
def allocation_region(base: int | str, size: int | str, prealloc_size: int | str | None = None) -> Iterator[None]:
    """Sets the region for the duration of the block, then stops it (allocations made inside stay valid).

    With ``prealloc_size``, that much is mapped up front so the allocations inside are driver-free.
    """
    set_allocation_region(base, size)
    if prealloc_size is not None:
        preallocate_region(prealloc_size)
    try:
        yield
    finally:
        stop_allocation_region()


# ---- allocation log ----------------------------------------------------------------------


@dataclass(frozen=True)
class LogEntry:
    seq: int
    kind: str
    offset: int
    size: int
    tag: str = ""

    def same_event(self, other: LogEntry) -> bool:
        return (self.kind, self.offset, self.size) == (other.kind, other.offset, other.size)


@dataclass(frozen=True)
class Divergence:
    seq: int
    expected: LogEntry | None
    actual: LogEntry | None

    def __str__(self) -> str:
        def show(e: LogEntry | None) -> str:
            return "nothing" if e is None else f"{e.kind} of {e.size} bytes at offset {e.offset:#x} (tag {e.tag!r})"

        return f"allocation sequence diverged at seq {self.seq}: expected {show(self.expected)}, got {show(self.actual)}"


def set_allocation_tag(tag: str) -> None:
    """Tags later region events (e.g. "capture bs=8") so a divergence report says where it happened."""
    _native.call("foundry_region_set_tag", tag.encode(), None)


def allocation_log_size() -> int:
    """How many region events the log holds (the next event's position)."""
    count = ctypes.c_uint64()
    _native.call("foundry_region_log_size", ctypes.byref(count))
    return count.value


def allocation_log(first: int = 0) -> list[LogEntry]:
    """Every region event since the region was set, in order; from position ``first`` on when
    given (:func:`allocation_log_size` before a step, then this after it: the step's events)."""
    count = max(allocation_log_size() - first, 0)
    raw = (_native.LogEntry * max(count, 1))()
    written = ctypes.c_uint64()
    _native.call("foundry_region_log_read", first, raw, count, ctypes.byref(written))
    tags: dict[int, str] = {}
    out = []
    for e in raw[: written.value]:
        if e.tag not in tags:
            buf = ctypes.create_string_buffer(512)
            _native.call("foundry_region_log_tag", e.tag, buf, len(buf))
            tags[e.tag] = buf.value.decode(errors="replace")
        kind = LOG_KINDS[e.kind] if e.kind < len(LOG_KINDS) else f"kind{e.kind}"
        out.append(LogEntry(e.seq, kind, e.offset, e.size, tags[e.tag]))
    return out


def compare_logs(expected: list[LogEntry], actual: list[LogEntry]) -> Divergence | None:
    """The first event where two logs differ (kind, offset or size), or None when one is a prefix
    of the other and they agree up to there (a LOAD that stops early is not a divergence)."""
    exp = [e for e in expected if e.kind in COMPARED_KINDS]
    act = [e for e in actual if e.kind in COMPARED_KINDS]
    for e, a in zip(exp, act):
        if not e.same_event(a):
            return Divergence(a.seq, e, a)
    return None


# The events that place memory: frees differ harmlessly between SAVE and LOAD (LOAD skips the
# warmup whose memory capture released), but every placement LOAD makes must be where SAVE made it.
PLACEMENT_KINDS = frozenset({"alloc", "reserve", "outside", "seal"})


def compare_placements(saved: list[LogEntry], current: list[LogEntry]) -> Divergence | None:
    """The first placement (allocation, reservation, seal) of ``current`` that differs from the
    placement at the same position in ``saved``; None when ``current``'s placements are a prefix of
    ``saved``'s. A LOAD process places its buffers (weights, inputs, caches) as SAVE did, then stops.

    A claim in ``current`` of exactly the block SAVE allocated at that position stands for that
    allocation (a restore that places SAVE's memory without redoing the work that allocated it,
    :func:`claim_region`); other claims (a restore's graph memory) are not placements."""
    exp = [e for e in saved if e.kind in PLACEMENT_KINDS]
    i = 0
    for a in current:
        e = exp[i] if i < len(exp) else None
        if a.kind == "claim":
            if e is not None and e.kind == "alloc" and (e.offset, e.size) == (a.offset, a.size):
                i += 1
            continue
        if a.kind not in PLACEMENT_KINDS:
            continue
        if e is None or not e.same_event(a):
            return Divergence(a.seq, e, a)
        i += 1
    return None


def placement_divergence(saved: list[LogEntry], current: list[LogEntry] | None = None) -> str | None:
    """:func:`compare_placements` of ``saved`` and ``current`` (default: this process's log so far)
    as a message: the first diverging placement and the four events before it on each side (their
    tags name the steps), or None when the placements agree."""
    current = allocation_log() if current is None else current
    divergence = compare_placements(saved, current)
    if divergence is None:
        return None

    def before(log: list[LogEntry], seq: int | None) -> str:
        events = [e for e in log if seq is None or e.seq < seq][-4:]
        return "; ".join(f"{e.kind} {e.size:#x} at {e.offset:#x} ({e.tag})" for e in events) or "nothing"

    expected = divergence.expected.seq if divergence.expected is not None else None
    return f"{divergence}; before it, at SAVE: {before(saved, expected)}; here: {before(current, divergence.seq)}"


def expect_allocation_log(entries: list[LogEntry]) -> None:
    """Compares every region event from now on against ``entries`` (by sequence number).

    The first divergence is kept (see :func:`allocation_divergence`); in strict mode
    (FOUNDRY_STRICT=1) the diverging allocation fails instead of landing elsewhere.
    """
    arr = (_native.LogEntry * max(len(entries), 1))()
    for i, e in enumerate(entries):
        arr[i] = _native.LogEntry(e.seq, e.offset, e.size, LOG_KINDS.index(e.kind), 0)
    _native.call("foundry_region_expect", arr, len(entries))


def allocation_divergence() -> Divergence | None:
    """The first divergence from the expected log, or None."""
    diverged = ctypes.c_int()
    exp, act = _native.LogEntry(), _native.LogEntry()
    _native.call("foundry_region_divergence", ctypes.byref(diverged), ctypes.byref(exp), ctypes.byref(act))
    if not diverged.value:
        return None

    def entry(e: _native.LogEntry) -> LogEntry | None:
        if e.kind == 0xFFFFFFFF:
            return None
        return LogEntry(e.seq, LOG_KINDS[e.kind] if e.kind < len(LOG_KINDS) else "?", e.offset, e.size)

    return Divergence(act.seq, entry(exp), entry(act))


def claim_region(offset: int, size: int) -> bool:
    """Marks ``[offset, offset+size)`` of the region live and maps it, as an allocation placed
    there would be (a restore claims the memory its graphs reference this way). Returns False when
    exactly that block is live already; raises DivergenceError when the range overlaps another
    live block (the memory layout differs from the recorded one)."""
    mapped = ctypes.c_int()
    _native.call("foundry_region_claim", offset, size, ctypes.byref(mapped))
    return bool(mapped.value)


def require_region() -> RegionInfo:
    """The region, or StateError telling the caller to set one."""
    try:
        return region_info()
    except StateError:
        raise StateError("no allocation region is set; call set_allocation_region(base, size) first") from None

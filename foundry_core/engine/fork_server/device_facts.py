"""torch.cuda's device queries answered from NVML while the fork server imports the engine.

``import sgl_kernel`` picks its kernel library by the GPU's compute capability, which it asks
through ``torch.cuda.current_device()`` and ``get_device_properties()``: that initialises CUDA (seen
on the H200 with SGLang 0.5.17 and sglang-kernel 0.4.5), and a process that initialised CUDA
cannot fork children that use it. During the fork server's imports,
those queries get the same answers from NVML (:func:`answered_from` with :func:`nvml_facts`), which
never touches the CUDA driver; afterwards torch's own functions are back.

``torch.get_device_module()`` without a device asks ``torch._C._get_accelerator()``, whose CUDA
check counts devices through the CUDA runtime (cuInit): SGLang 0.5.17 calls it at import, in the
class body of ``distributed/parallel_state.py``'s ``GraphCaptureContext`` (an annotation) and at module level in
``managers/cache_controller.py``. Its stand-in answers ``cuda`` when NVML sees a device.

A module may keep a reference to a query while the stand-ins are in place: ``from torch.cuda import
current_device`` at import, Triton's driver (made at import by SGLang's ``fla`` kernels, it binds
``torch.cuda.current_device``), or torch's ``_dynamo/device_interface.py``, whose ``CudaInterface``
binds ``staticmethod(torch.cuda.get_device_properties)`` in its class body (Inductor asks it for the
SM count, which NVML's facts do not have). So a stand-in answers from NVML only inside the block:
outside it, and in every child forked later, it calls torch's own function, whoever holds it.
Nothing needs finding and putting back (a walk of every module, class and object the imports made
took 0.5-0.9 s of the fork server's time on the H200, while a launch may wait for it).
:func:`kept_stand_ins` says which were kept, for the log.

An import could also keep an *answer*: a ``DeviceFacts`` from the stand-in
``get_device_properties`` in a cache (``functools.cache``) or a module's variable, read later for a
property NVML does not give. :func:`kept_answers` finds each one still referenced after the
imports (every answer is a copy of its own, so only its keeper refers to it); that makes the fork
server unsafe too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

# What is answered, as "<attribute of torch>.<function>": torch.cuda's device queries, looked up at
# call time by their callers, and the accelerator query of torch.get_device_module().
QUERIES = ("cuda.current_device", "cuda.get_device_properties", "cuda.get_device_capability",
           "cuda.get_device_name", "_C._get_accelerator")


def owner(torch: Any, query: str) -> tuple[Any, str]:
    """(the object that holds ``query``'s function, None where torch has no such object; the
    function's name)."""
    where, name = query.rsplit(".", 1)
    return getattr(torch, where, None), name


@dataclass(frozen=True)
class DeviceFacts:
    """What a device's ``torch.cuda.get_device_properties`` gives, as far as NVML knows it."""

    name: str
    major: int
    minor: int
    total_memory: int


def nvml_facts(torch: Any, nvml: Any) -> Callable[[int], DeviceFacts]:
    """A function of a CUDA device index (as this process numbers devices, CUDA_VISIBLE_DEVICES
    applied) to its facts from NVML; raises when NVML or torch cannot map the index."""
    nvml.nvmlInit()
    cache: dict[int, DeviceFacts] = {}

    def facts(index: int) -> DeviceFacts:
        if index not in cache:
            handle = nvml.nvmlDeviceGetHandleByIndex(torch.cuda._get_nvml_device_index(index))
            name = nvml.nvmlDeviceGetName(handle)
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            cache[index] = DeviceFacts(name.decode() if isinstance(name, bytes) else str(name), int(major), int(minor),
                                       int(nvml.nvmlDeviceGetMemoryInfo(handle).total))
        return cache[index]

    return facts


def _index(device: Any) -> int:
    if device is None:
        return 0
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        return int(device.split(":")[1]) if ":" in device else 0
    index = getattr(device, "index", None)
    return 0 if index is None else int(index)


def stand_ins(facts: Callable[[int], DeviceFacts], device: Callable[[str], Any],
              given: list[DeviceFacts] | None = None) -> dict[str, Callable[..., Any]]:
    """The :data:`QUERIES`, answered from ``facts``; the current device is device 0, as in a
    process that has not chosen one; the accelerator is ``device("cuda")`` when ``facts`` knows
    device 0, else ``device("cpu")`` (torch's answer without a CUDA device).
    ``get_device_properties`` answers with a copy of its own, appended to ``given``."""

    def current_device() -> int:
        return 0

    def get_device_properties(device: Any = None) -> DeviceFacts:
        answer = dataclasses.replace(facts(_index(device)))
        if given is not None:
            given.append(answer)
        return answer

    def get_device_capability(device: Any = None) -> tuple[int, int]:
        f = facts(_index(device))
        return f.major, f.minor

    def get_device_name(device: Any = None) -> str:
        return facts(_index(device)).name

    def get_accelerator() -> Any:
        try:
            facts(0)
        except Exception:  # noqa: BLE001 - NVML has no device 0, so neither has CUDA
            return device("cpu")
        return device("cuda")

    return {"cuda.current_device": current_device, "cuda.get_device_properties": get_device_properties,
            "cuda.get_device_capability": get_device_capability, "cuda.get_device_name": get_device_name,
            "_C._get_accelerator": get_accelerator}


@dataclass
class Answers:
    """What :func:`answered_from` put in place: the stand-ins by query with their reference counts
    before the block (for :func:`kept_stand_ins`) and each ``get_device_properties`` answer (for
    :func:`kept_answers`)."""

    stand_ins: dict[str, Callable[..., Any]] = field(default_factory=dict)
    given: list[DeviceFacts] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    nvml_s: float = 0.0  # what starting NVML took (Foundry's own step, before the imports)


class _Switch:
    """Whether the stand-ins of one :func:`answered_from` answer from NVML."""

    on = True


def _switched(own: Callable[..., Any], answer: Callable[..., Any], switch: _Switch) -> Callable[..., Any]:
    """``answer`` while ``switch`` is on, ``own`` (torch's function, whose name and signature it
    takes) after."""

    @functools.wraps(own)
    def query(*args: Any, **kwargs: Any) -> Any:
        return answer(*args, **kwargs) if switch.on else own(*args, **kwargs)

    return query


@contextlib.contextmanager
def answered_from(torch: Any, facts: Callable[[int], DeviceFacts]) -> Iterator[Answers]:
    """For the duration of the block, the :data:`QUERIES` answer from ``facts`` (see
    :func:`nvml_facts`); yields what stands in. After the block torch holds its own functions
    again, and a stand-in an import kept calls them. A query this torch lacks is left out."""
    answers, switch = Answers(), _Switch()
    own = {q: getattr(*owner(torch, q)) for q in QUERIES if hasattr(*owner(torch, q))}
    answers.stand_ins = {q: _switched(own[q], fn, switch)
                         for q, fn in stand_ins(facts, torch.device, answers.given).items() if q in own}
    answers.counts = _references(list(answers.stand_ins.values()))
    for q, fn in answers.stand_ins.items():
        setattr(*owner(torch, q), fn)
    try:
        yield answers
    finally:
        switch.on = False
        for q, fn in own.items():
            setattr(*owner(torch, q), fn)


def kept_stand_ins(answers: Answers) -> list[str]:
    """The queries whose stand-in something besides ``answers`` still holds after the block (each
    calls torch's own function now): reference counts against those before the block."""
    now = _references(list(answers.stand_ins.values()))
    return [q for q, before, after in zip(answers.stand_ins, answers.counts, now) if after > before]


def kept_answers(given: list[DeviceFacts]) -> list[str]:
    """What still refers to one of the ``get_device_properties`` answers in ``given``, besides
    ``given`` itself: the referring objects' types, each once (a cache's ``dict``, a ``list``, a ``cell``...).
    Reference counts pick the kept answers (against a copy only a list holds, counted alike); only
    those are looked for among the collector's objects, a walk of a tenth of a second for two
    million that the fork server's checks otherwise skip."""
    if not given:
        return []
    alone = _references([dataclasses.replace(given[0])])[0]
    kept = [answer for answer, count in zip(given, _references(given)) if count > alone]
    if not kept:
        return []
    return sorted({type(r).__name__ for r in gc.get_referrers(*kept) if r is not given and r is not kept})


def _references(values: list[Any]) -> list[int]:
    """Each value's reference count as this loop reads it (its list's, the loop's, the call's)."""
    return [sys.getrefcount(value) for value in values]

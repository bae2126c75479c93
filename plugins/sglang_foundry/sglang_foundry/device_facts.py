"""torch.cuda's device queries answered from NVML while the fork server imports SGLang.

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

A module that kept a reference to one of the stand-ins (``from torch.cuda import current_device``
at import, or Triton's driver, made at import by SGLang's ``fla`` kernels, which binds
``torch.cuda.current_device``) would answer from NVML for good, also after ``torch.cuda.set_device``:
:func:`rebind` puts torch's own functions back there, and :func:`kept_references` finds what it
could not mend, which makes the fork server unsafe, so SGLang's children are spawned as usual.
Classes are walked too: torch's ``_dynamo/device_interface.py`` binds
``staticmethod(torch.cuda.get_device_properties)`` (and ``current_device``) in ``CudaInterface``'s
class body, and Inductor's code generation asks it for the SM count, which the stand-in's facts do
not have (seen on the H200 with ``--enable-torch-compile``).

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
import types
import warnings
from collections.abc import Callable, Iterator, Mapping
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
    """What :func:`answered_from` put in place: the stand-ins by query (for :func:`rebind` and
    :func:`kept_references`) and each ``get_device_properties`` answer (for :func:`kept_answers`)."""

    stand_ins: dict[str, Callable[..., Any]] = field(default_factory=dict)
    given: list[DeviceFacts] = field(default_factory=list)


@contextlib.contextmanager
def answered_from(torch: Any, facts: Callable[[int], DeviceFacts]) -> Iterator[Answers]:
    """For the duration of the block, the :data:`QUERIES` answer from ``facts`` (see
    :func:`nvml_facts`); yields what stands in. A query this torch lacks is left out."""
    answers = Answers()
    answers.stand_ins = {q: fn for q, fn in stand_ins(facts, torch.device, answers.given).items()
                         if hasattr(*owner(torch, q))}
    saved = {q: getattr(*owner(torch, q)) for q in answers.stand_ins}
    for q, fn in answers.stand_ins.items():
        setattr(*owner(torch, q), fn)
    try:
        yield answers
    finally:
        for q, fn in saved.items():
            setattr(*owner(torch, q), fn)


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


def _references(answers: list[DeviceFacts]) -> list[int]:
    """Each answer's reference count as this loop reads it (its list's, the loop's, the call's)."""
    return [sys.getrefcount(answer) for answer in answers]


# Values never walked into: modules, functions (their attributes are not an import's state).
# Classes are walked (class bodies bind torch's functions), as their own kind of holder.
_NOT_PLAIN = (type, types.ModuleType, types.FunctionType, types.MethodType, types.BuiltinFunctionType,
              functools.partial)
_WRAPPERS = (staticmethod, classmethod)
# The commonest attribute types that hold nothing walked: skipped before the costlier checks.
_LEAVES = frozenset({types.FunctionType, types.BuiltinFunctionType, types.ModuleType, staticmethod, classmethod,
                     property, str, int, float, bool, type(None), tuple, list, dict, set, frozenset, bytes})


def _held(value: Any) -> Any:
    """What an attribute holds: the function inside a ``staticmethod``/``classmethod``."""
    return value.__func__ if type(value) in _WRAPPERS else value


def _holding(ids: set[int], depth: int = 3) -> list[tuple[str, Any, str, Any]]:
    """(path, holder, attribute, value) for every attribute, of every loaded module, of the
    classes defined there and of the plain objects those hold down to ``depth`` levels from the
    module, whose value (or the function its ``staticmethod``/``classmethod`` wraps) is one of
    ``ids`` (Triton keeps its driver, which binds torch.cuda's functions, in
    ``triton.runtime.driver._default``; torch's ``CudaInterface`` binds them in its class body).
    One pass, paths made only for what it finds: the fork server walks many thousand modules
    while a launch may be waiting."""
    found: list[tuple[str, Any, str, Any]] = []
    seen: set[int] = set()

    def walk(path: str, holder: Any, level: int) -> None:
        for attr, value in list(_own_attributes(holder).items()):
            kind = type(value)
            if id(value.__func__ if kind in _WRAPPERS else value) in ids:  # _held, inlined: the hot loop
                found.append((f"{path}.{attr}", holder, attr, value))
            elif level < depth and kind not in _LEAVES and id(value) not in seen and _walked(value, holder):
                seen.add(id(value))
                walk(f"{path}.{attr}", value, level + 1)

    # Reading some attributes warns (torch.distributed.reduce_op is deprecated): not the user's doing.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, module in list(sys.modules.items()):
            if module is not None:
                walk(name, module, 1)
    return found


def _walked(value: Any, holder: Any) -> bool:
    """A plain object with attributes of its own, or a class defined where it is found (a module's
    own classes and their nested ones; a class imported from elsewhere is walked from its module).
    Nothing an import defined can make the walk raise: what cannot be read is not walked."""
    try:
        if isinstance(value, type):
            if isinstance(holder, types.ModuleType):
                where = _own_attributes(holder).get("__name__")
            else:
                where = _own_attributes(holder if isinstance(holder, type) else type(holder)).get("__module__")
            return _own_attributes(value).get("__module__") == where
        return _plain_object(value)
    except Exception:  # noqa: BLE001 - see above
        return False


def _plain_object(value: Any) -> bool:
    """An instance with attributes of its own: not a module, class, function or builtin."""
    return type(value).__dictoffset__ != 0 and not isinstance(value, _NOT_PLAIN) and bool(_own_attributes(value))


def _own_attributes(holder: Any) -> Mapping[str, Any]:
    """``holder.__dict__`` as Python stores it, or nothing: read past ``__getattr__`` and
    ``__getattribute__`` hooks, which may raise anything (pydantic's placeholder validator on
    ``BaseModel``, a slotted object, raises ``PydanticUserError`` for any attribute it lacks)."""
    try:
        found = object.__getattribute__(holder, "__dict__")
    except Exception:  # noqa: BLE001 - no dictionary of its own
        return {}
    return found if isinstance(found, (dict, types.MappingProxyType)) else {}


def kept_references(replaced: dict[str, Callable[..., Any]]) -> list[str]:
    """The paths of loaded modules' attributes (and their objects', :func:`_holding`) that are one
    of the stand-ins."""
    return sorted(path for path, _, _, _ in _holding({id(fn) for fn in replaced.values()}))


def rebind(replaced: dict[str, Callable[..., Any]], torch: Any) -> tuple[list[str], list[str]]:
    """Puts torch's own function back wherever an import kept a stand-in (after the block of
    :func:`answered_from`, so torch holds them again), in one walk of :func:`_holding`; returns
    the paths it mended and those it could not (as :func:`kept_references` names them)."""
    by_id = {id(fn): query for query, fn in replaced.items()}
    mended, kept = [], []
    for path, holder, attr, value in _holding(set(by_id)):
        own = getattr(*owner(torch, by_id[id(_held(value))]))
        try:
            setattr(holder, attr, type(value)(own) if isinstance(value, _WRAPPERS) else own)
            mended.append(path)
        except (AttributeError, TypeError):
            kept.append(path)
    return sorted(mended), sorted(kept)

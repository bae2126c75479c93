"""The eager calls between the segments of SGLang's breakable prefill graphs, as an archive keeps them.

SGLang's default prefill CUDA graph (the ``breakable`` backend) is a list of plain CUDA graph
segments with an eager call between each two: where the captured forward reaches a function
decorated with ``eager_on_graph`` (attention), the segment ends, the function runs once, and the
graph keeps a ``replay_fn`` closure in ``BreakableCUDAGraph._break_fns`` that calls the function
again with the same arguments and copies its result into the first call's output
(``_copy_output``). Its cells (``captured_inner``, ``captured_args``, ``captured_kwargs``,
``captured_output``) are the same in SGLang 0.5.17 and 0.5.23; the seam ``bcg.eager_on_graph``
checks that in the source.

A closure cannot be saved, so SAVE describes each one (:func:`describe`): the function by the
module attribute that holds its decorated form (``sglang.srt.layers.radix_attention:
breakable_unified_attention_with_output``: the undecorated function may be a torch custom op
with no importable name of its own), each tensor argument as an index into the tensors saved with
the segment before it (LOAD rebuilds them at their SAVE addresses), everything else by value.
LOAD rebuilds the closure (:func:`rebuild`) around the decorated function, which outside a capture
calls the undecorated one, as SGLang's replay does.

The arguments of SGLang's eager calls are tensors (the graph's static buffers), plain values (the
layer id, ``save_kv_cache``) and ``None``; the per-batch state they need (the forward batch) is
read from SGLang's forward context while they run, set by the prefill runner before each replay.
Anything else is refused by name (:class:`~foundry_core.errors.UnsupportedError`): SAVE then
writes no archive.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import ModuleType
from typing import Any

from foundry_core.errors import MismatchError, UnsupportedError

CELLS = ("captured_inner", "captured_args", "captured_kwargs", "captured_output")
_VALUES = (type(None), bool, int, float, str)
# What eager_on_graph's wrapper asks to tell a capture from a plain call (0.5.17 and 0.5.23).
_CAPTURE_VAR = "_current_capture_var"

__all__ = ["CELLS", "closure_cells", "decorated_index", "describe", "rebuild", "resolve", "undecorated"]


def closure_cells(replay_fn: Callable[..., Any]) -> dict[str, Any]:
    """The cells of one of SGLang's ``replay_fn`` closures, by name; UnsupportedError naming the
    missing ones when it is not such a closure."""
    code = getattr(replay_fn, "__code__", None)
    closure = getattr(replay_fn, "__closure__", None) or ()
    names = tuple(getattr(code, "co_freevars", ()))
    cells = {name: cell.cell_contents for name, cell in zip(names, closure)}
    missing = [name for name in CELLS if name not in cells]
    if missing:
        raise UnsupportedError(f"a breakable prefill graph's eager call {getattr(replay_fn, '__qualname__', replay_fn)!r} "
                               f"does not keep {', '.join(missing)} (SGLang's eager_on_graph changed)")
    return {name: cells[name] for name in CELLS}


def undecorated(value: Any) -> Any | None:
    """The function ``eager_on_graph`` wrapped in ``value``, or None when ``value`` is not one of
    its results: 0.5.23's callable keeps it as ``_eager_call``; 0.5.17's wrapper in its closure
    cell ``inner``."""
    eager = getattr(type(value), "run_eager", None) and getattr(value, "_eager_call", None)
    if eager is not None:
        return eager
    code = getattr(value, "__code__", None)
    if (code is None or getattr(value, "__name__", "") != "wrapper" or "inner" not in code.co_freevars
            or _CAPTURE_VAR not in code.co_names):  # another decorator's wrapper
        return None
    return value.__closure__[code.co_freevars.index("inner")].cell_contents


def decorated_index(modules: Iterable[tuple[str, ModuleType]]) -> dict[int, str]:
    """``{id(undecorated function): "module:attribute"}`` for every module attribute in
    ``modules`` that is a function decorated with ``eager_on_graph``."""
    index: dict[int, str] = {}
    for name, module in modules:
        for attr, value in list(vars(module).items()):
            inner = undecorated(value)
            if inner is not None:
                index.setdefault(id(inner), f"{name}:{attr}")
    return index


def _encode(value: Any, is_tensor: Callable[[Any], bool], tensors: list[Any], where: str) -> dict[str, Any]:
    if is_tensor(value):
        tensors.append(value)
        return {"tensor": len(tensors) - 1}
    if isinstance(value, _VALUES):
        return {"value": value}
    if isinstance(value, (tuple, list)):
        items = [_encode(v, is_tensor, tensors, where) for v in value]
        return {"tuple": items} if isinstance(value, tuple) else {"list": items}
    raise UnsupportedError(f"a breakable prefill graph's eager call {where} takes a {type(value).__name__}, which "
                           "an archive cannot keep (tensors, numbers, strings and None only)")


def describe(replay_fn: Callable[..., Any], index: Mapping[int, str], is_tensor: Callable[[Any], bool],
             tensors: list[Any]) -> dict[str, Any]:
    """The archive's record of one eager call; its tensors (arguments, then the output) are
    appended to ``tensors``, which SAVE saves with the segment before the call."""
    cells = closure_cells(replay_fn)
    inner = cells["captured_inner"]
    function = index.get(id(inner))
    if function is None:
        raise UnsupportedError(f"a breakable prefill graph's eager call runs {getattr(inner, '__name__', inner)!r}, "
                               "which no module attribute holds decorated with eager_on_graph")
    return {
        "function": function,
        "args": [_encode(a, is_tensor, tensors, function) for a in cells["captured_args"]],
        "kwargs": {k: _encode(v, is_tensor, tensors, function) for k, v in cells["captured_kwargs"].items()},
        "output": _encode(cells["captured_output"], is_tensor, tensors, function),
    }


def resolve(function: str) -> Callable[..., Any]:
    """The decorated function a record names (``module:attribute``); MismatchError when this
    SGLang has no such attribute, or it is not decorated with ``eager_on_graph``."""
    module, _, attr = function.partition(":")
    try:
        value = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise MismatchError(f"the archive's prefill graphs call {function}, which this SGLang lacks ({exc})") from None
    if undecorated(value) is None:
        raise MismatchError(f"the archive's prefill graphs call {function}, which this SGLang does not run eagerly "
                            "between graph segments")
    return value


def _decode(item: Mapping[str, Any], tensors: Sequence[Any]) -> Any:
    if "tensor" in item:
        i = item["tensor"]
        if not isinstance(i, int) or not 0 <= i < len(tensors):
            raise MismatchError(f"a prefill graph's eager call names tensor {i!r} of {len(tensors)} restored")
        return tensors[i]
    if "value" in item:
        return item["value"]
    if "tuple" in item:
        return tuple(_decode(v, tensors) for v in item["tuple"])
    if "list" in item:
        return [_decode(v, tensors) for v in item["list"]]
    raise MismatchError(f"a prefill graph's eager call has an argument the archive does not describe: {item!r}")


def rebuild(record: Mapping[str, Any], tensors: Sequence[Any], copy_output: Callable[[Any, Any], Any],
            resolve_function: Callable[[str], Callable[..., Any]] = resolve) -> Callable[[], Any]:
    """The ``replay_fn`` SGLang would have kept, from its record and the restored ``tensors``:
    calls the function with the recorded arguments, then ``copy_output`` (SGLang's
    ``_copy_output``) from its result into the recorded output."""
    try:
        function = resolve_function(str(record["function"]))
        args = tuple(_decode(a, tensors) for a in record["args"])
        kwargs = {str(k): _decode(v, tensors) for k, v in record["kwargs"].items()}
        output = _decode(record["output"], tensors)
    except (KeyError, TypeError, AttributeError) as exc:
        raise MismatchError(f"a prefill graph's eager call record is malformed ({type(exc).__name__}: {exc})") from None

    def replay_fn() -> Any:
        return copy_output(output, function(*args, **kwargs))

    replay_fn.__qualname__ = f"restored eager call {record['function']}"
    return replay_fn

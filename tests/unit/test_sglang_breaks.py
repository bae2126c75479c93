"""The breakable prefill graphs' eager calls: described at SAVE, rebuilt at LOAD (breaks.py),
against a small stand-in for SGLang's eager_on_graph in both its 0.5.17 and 0.5.23 forms."""

from __future__ import annotations

import contextvars
import functools
import sys
import types

import pytest

from foundry_core.errors import MismatchError, UnsupportedError
from sglang_foundry import breaks


class FakeTensor:
    def __init__(self, address: int, values: list[float] | None = None):
        self.address = address
        self.values = list(values or [])

    def copy_(self, other: FakeTensor) -> FakeTensor:
        self.values = list(other.values)
        return self


def is_tensor(x) -> bool:
    return isinstance(x, FakeTensor)


def copy_output(dst, src):  # what SGLang's _copy_output does for tensors and None
    if is_tensor(dst) and is_tensor(src):
        return dst.copy_(src)
    return src


_current_capture_var: contextvars.ContextVar = contextvars.ContextVar("capture", default=None)


class Capture:
    """Collects replay closures the way SGLang's BreakableCUDAGraph keeps them."""

    def __init__(self):
        self.break_fns = []


def _replay_closure(inner, args, kwargs, output):
    captured_inner = inner
    captured_args = tuple(args)
    captured_kwargs = dict(kwargs)
    captured_output = output

    def replay_fn():
        return copy_output(captured_output, captured_inner(*captured_args, **captured_kwargs))

    return replay_fn


def eager_on_graph_0517(enable, capture_stub=None):
    def decorator(inner):
        def wrapper(*args, **kwargs):
            capture = _current_capture_var.get()
            if capture is None:
                return inner(*args, **kwargs)
            output = (capture_stub or inner)(*args, **kwargs)
            capture.break_fns.append(_replay_closure(inner, args, kwargs, output))
            return output

        return wrapper

    return decorator


class EagerCallable:  # 0.5.23's form: an object with both entry points
    def __init__(self, graph_call, eager_call):
        self._graph_call, self._eager_call = graph_call, eager_call

    def __call__(self, *args, **kwargs):
        return self._graph_call(*args, **kwargs)

    def run_eager(self, *args, **kwargs):
        return self._eager_call(*args, **kwargs)


def eager_on_graph_0523(fn):
    return functools.update_wrapper(EagerCallable(eager_on_graph_0517(True)(fn), fn), fn)


calls: list[tuple] = []


def attention_with_output(query, key, value, output, save_kv_cache, layer_id, *, scale=1.0):
    calls.append((query.address, key, output.address, save_kv_cache, layer_id, scale))
    output.values = [v * 2 for v in query.values]


def attention_returning(query, layer_id):
    return FakeTensor(0x9000, [v + layer_id for v in query.values])


@pytest.fixture(params=["0.5.17", "0.5.23"])
def layers(request, monkeypatch):
    decorate = eager_on_graph_0517(True) if request.param == "0.5.17" else eager_on_graph_0523
    module = types.ModuleType("fake_sglang_layers")
    module.breakable_attention_with_output = decorate(attention_with_output)
    module.breakable_attention_returning = decorate(attention_returning)

    def plain_wrapper_elsewhere(inner):  # another decorator's wrapper: not an eager call
        def wrapper(*a):
            return inner(*a)
        return wrapper

    module.not_a_break = plain_wrapper_elsewhere(attention_returning)
    monkeypatch.setitem(sys.modules, "fake_sglang_layers", module)
    calls.clear()
    return module


def _captured(fn, *args, **kwargs):
    capture = Capture()
    token = _current_capture_var.set(capture)
    try:
        fn(*args, **kwargs)
    finally:
        _current_capture_var.reset(token)
    (replay_fn,) = capture.break_fns
    return replay_fn


def test_the_index_finds_each_decorated_function_by_its_module_attribute(layers):
    index = breaks.decorated_index([("fake_sglang_layers", layers)])
    assert index == {id(attention_with_output): "fake_sglang_layers:breakable_attention_with_output",
                     id(attention_returning): "fake_sglang_layers:breakable_attention_returning"}


def test_an_eager_call_is_described_and_rebuilt_to_the_same_call(layers):
    q, out = FakeTensor(0x1000, [1.0, 2.0]), FakeTensor(0x2000)
    replay_fn = _captured(layers.breakable_attention_with_output, q, None, None, out, True, 7, scale=0.5)
    tensors: list = []
    record = breaks.describe(replay_fn, breaks.decorated_index([("fake_sglang_layers", layers)]), is_tensor, tensors)
    assert record == {"function": "fake_sglang_layers:breakable_attention_with_output",
                      "args": [{"tensor": 0}, {"value": None}, {"value": None}, {"tensor": 1}, {"value": True},
                               {"value": 7}],
                      "kwargs": {"scale": {"value": 0.5}}, "output": {"value": None}}
    assert tensors == [q, out]

    # LOAD: tensors rebuilt at the same addresses, new values in the input.
    q2, out2 = FakeTensor(0x1000, [3.0]), FakeTensor(0x2000)
    calls.clear()
    assert breaks.rebuild(record, [q2, out2], copy_output)() is None
    assert calls == [(0x1000, None, 0x2000, True, 7, 0.5)]
    assert out2.values == [6.0]


def test_a_rebuilt_call_copies_a_returned_tensor_into_the_recorded_output(layers):
    q = FakeTensor(0x1000, [1.0])
    replay_fn = _captured(layers.breakable_attention_returning, q, 2)
    tensors: list = []
    record = breaks.describe(replay_fn, breaks.decorated_index([("fake_sglang_layers", layers)]), is_tensor, tensors)
    assert record["output"] == {"tensor": 1} and tensors[1].address == 0x9000
    bridge = FakeTensor(0x9000)  # the output buffer the next segment reads, restored
    result = breaks.rebuild(record, [FakeTensor(0x1000, [5.0]), bridge], copy_output)()
    assert result is bridge and bridge.values == [7.0]


def test_an_argument_an_archive_cannot_keep_is_refused_by_type(layers):
    replay_fn = _captured(layers.breakable_attention_returning, FakeTensor(1), object())
    with pytest.raises(UnsupportedError, match="takes a object"):
        breaks.describe(replay_fn, breaks.decorated_index([("fake_sglang_layers", layers)]), is_tensor, [])


def test_a_function_no_module_holds_decorated_is_refused(layers):
    def local_attention(query):
        return query

    replay_fn = _captured(eager_on_graph_0517(True)(local_attention), FakeTensor(1))
    with pytest.raises(UnsupportedError, match="local_attention"):
        breaks.describe(replay_fn, breaks.decorated_index([("fake_sglang_layers", layers)]), is_tensor, [])


def test_a_closure_without_sglangs_cells_is_refused():
    with pytest.raises(UnsupportedError, match="captured_inner"):
        breaks.closure_cells(lambda: None)


def test_load_refuses_a_function_this_sglang_lacks_or_does_not_break_on(layers):
    with pytest.raises(MismatchError, match="lacks"):
        breaks.resolve("fake_sglang_layers:gone")
    with pytest.raises(MismatchError, match="does not run eagerly"):
        breaks.resolve("fake_sglang_layers:not_a_break")
    with pytest.raises(MismatchError, match="lacks"):
        breaks.resolve("no_such_sglang_module:f")


def test_load_refuses_a_record_that_names_a_tensor_it_did_not_restore(layers):
    record = {"function": "fake_sglang_layers:breakable_attention_returning", "args": [{"tensor": 3}],
              "kwargs": {}, "output": {"value": None}}
    with pytest.raises(MismatchError, match="tensor 3 of 1"):
        breaks.rebuild(record, [FakeTensor(1)], copy_output)
    with pytest.raises(MismatchError, match="malformed"):
        breaks.rebuild({"function": "fake_sglang_layers:breakable_attention_returning"}, [], copy_output)


def test_tuples_and_lists_keep_their_shape(layers):
    replay_fn = _captured(layers.breakable_attention_returning, FakeTensor(0x10, [1.0]), 1)
    cells = breaks.closure_cells(replay_fn)
    assert set(cells) == set(breaks.CELLS)
    tensors: list = []
    encoded = breaks._encode((FakeTensor(1), [2, None]), is_tensor, tensors, "f")
    assert encoded == {"tuple": [{"tensor": 0}, {"list": [{"value": 2}, {"value": None}]}]}
    assert breaks._decode(encoded, tensors) == (tensors[0], [2, None])

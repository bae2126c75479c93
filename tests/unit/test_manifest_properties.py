"""Property tests of manifest handling (foundry_core.manifest), with hypothesis.

* any JSON value (or any file) that is not a valid manifest is refused with FormatError or
  VersionError, never another exception;
* a valid manifest round-trips through write_manifest/read_manifest unchanged;
* a required field of the wrong type (or missing) is refused with a message naming the field;
* a manifest larger than MAX_MANIFEST_BYTES is refused before it is parsed.

Defects these tests found (non-numeric strides, deep nesting, huge integers escaping as raw
exceptions) are fixed; the tests assert the refusal.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from foundry_core import manifest as manifest_mod
from foundry_core.errors import ArchiveIOError, FormatError, VersionError
from foundry_core.manifest import DTYPES, FORMAT_NAME, FORMAT_VERSION, read_manifest, validate, write_manifest

REFUSALS = (FormatError, VersionError)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---- strategies -------------------------------------------------------------------------------

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12)
json_values = st.recursive(scalars | st.floats(), lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
file_names = st.text(min_size=1, max_size=16).filter(
    lambda n: n not in (".", "..") and not any(c in n for c in "/\\\0"))


@st.composite
def tensors(draw):
    ndim = draw(st.integers(0, 4))
    return {"ptr": draw(st.integers(0, 2 ** 64)), "shape": draw(st.lists(st.integers(0, 2 ** 40), min_size=ndim,
                                                                         max_size=ndim)),
            "stride": draw(st.lists(st.integers(-2 ** 40, 2 ** 40), min_size=ndim, max_size=ndim)),
            "dtype": draw(st.sampled_from(DTYPES))}


# Outputs are consistent with their kind: none holds no tensor, tensor exactly one.
outputs = (st.fixed_dictionaries({"kind": st.just("none"), "tensors": st.just([])})
           | st.fixed_dictionaries({"kind": st.just("tensor"), "tensors": st.lists(tensors(), min_size=1, max_size=1)})
           | st.fixed_dictionaries({"kind": st.sampled_from(["list", "tuple"]), "tensors": st.lists(tensors(), max_size=3)}))
graphs = st.fixed_dictionaries({
    "name": st.text(max_size=16),
    "outputs": outputs,
})
REQUIRED = ("format", "version", "fingerprint", "payload", "region", "graphs")


@st.composite
def valid_manifests(draw):
    m = {
        "format": FORMAT_NAME, "version": FORMAT_VERSION,
        "fingerprint": draw(st.dictionaries(st.text(max_size=16), scalars, max_size=8)),
        "payload": draw(file_names),
        "region": {k: draw(st.integers()) for k in ("base", "size", "high_water")},
        "graphs": draw(st.lists(graphs, max_size=4)),
    }
    optional = draw(st.fixed_dictionaries({}, optional={"log": file_names, "created": st.text(max_size=20),
                                                        "members": st.lists(st.text(max_size=8), max_size=3),
                                                        "groups": st.integers(0, 100)}))
    extra = draw(st.dictionaries(st.text(max_size=8).filter(lambda k: k not in REQUIRED and k not in optional and k != "log"),
                                 json_values.filter(lambda v: v == v), max_size=3))
    return {**m, **optional, **extra}


def has_nan(v) -> bool:
    if isinstance(v, float):
        return v != v
    if isinstance(v, list):
        return any(has_nan(x) for x in v)
    if isinstance(v, dict):
        return any(has_nan(x) for x in v.values())
    return False


def is_type(value, kind: type) -> bool:
    return isinstance(value, kind) and (kind is bool or not isinstance(value, bool))


def required_fields(m: dict) -> list[tuple[tuple, type]]:
    """(path, type) of every field validate requires, in the manifest `m`."""
    fields = [((k,), t) for k, t in (("format", str), ("version", int), ("fingerprint", dict), ("payload", str),
                                      ("region", dict), ("graphs", list))]
    fields += [(("region", k), int) for k in ("base", "size", "high_water")]
    for i, g in enumerate(m["graphs"]):
        fields += [(("graphs", i, "name"), str), (("graphs", i, "outputs"), dict),
                   (("graphs", i, "outputs", "kind"), str), (("graphs", i, "outputs", "tensors"), list)]
        for j, _ in enumerate(g["outputs"]["tensors"]):
            base = ("graphs", i, "outputs", "tensors", j)
            fields += [(base + ("ptr",), int), (base + ("shape",), list), (base + ("stride",), list),
                       (base + ("dtype",), str)]
    return fields


def all_paths(v, prefix=()) -> list[tuple]:
    """Every position in a JSON value (dict values and list elements), outermost first."""
    out = []
    items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
    for k, x in items:
        out.append(prefix + (k,))
        out += all_paths(x, prefix + (k,))
    return out


def replaced(m: dict, path: tuple, value) -> dict:
    m = json.loads(json.dumps(m))
    target = m
    for k in path[:-1]:
        target = target[k]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return m


_DELETE = object()


def in_dims(path: tuple) -> bool:
    """A position inside a tensor's shape or stride list (an element, or deeper)."""
    return len(path) >= 7 and path[0] == "graphs" and path[2:4] == ("outputs", "tensors") and path[5] in (
        "shape", "stride")


def check_refusal(value) -> None:
    try:
        out = validate(value)
    except REFUSALS:
        return
    assert out is value


# ---- any JSON value ------------------------------------------------------------------------------


@SETTINGS
@given(json_values)
def test_any_json_value_is_a_manifest_or_refused(value):
    check_refusal(value)


@SETTINGS
@given(json_values)
def test_any_json_object_with_the_right_format_and_version_is_checked_cleanly(value):
    """Random objects that get past the format and version checks, to reach the field checks."""
    m = {"format": FORMAT_NAME, "version": FORMAT_VERSION, **(value if isinstance(value, dict) else {"x": value})}
    check_refusal(m)


@settings(SETTINGS, max_examples=300)
@given(valid_manifests(), st.data())
def test_any_single_position_replaced_is_accepted_or_refused_cleanly(m, data):
    """One position of a valid manifest (outside tensors' dimension lists: see below) replaced by any
    JSON value."""
    paths = [p for p in all_paths(m) if not in_dims(p)]
    path = data.draw(st.sampled_from(paths), label="path")
    check_refusal(replaced(m, path, data.draw(json_values, label="value")))


# Deterministic and not shrunk: it fails on the first non-numeric stride element it draws.
@settings(SETTINGS, max_examples=100, derandomize=True, phases=[Phase.explicit, Phase.generate])
@given(valid_manifests().filter(lambda m: any(t["shape"] for g in m["graphs"] for t in g["outputs"]["tensors"])),
       st.data())
def test_any_tensor_dimension_replaced_is_accepted_or_refused_cleanly(m, data):
    paths = [p for p in all_paths(m) if in_dims(p)]
    path = data.draw(st.sampled_from(paths), label="path")
    check_refusal(replaced(m, path, data.draw(json_values, label="value")))


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("manifests")


@SETTINGS
@given(st.binary(max_size=512) | json_values.map(lambda v: json.dumps(v).encode()))
def test_any_file_is_a_manifest_or_refused(scratch, content):
    p = scratch / "manifest.json"
    p.write_bytes(content)
    try:
        read_manifest(p)
    except REFUSALS:
        pass


# ---- valid manifests -----------------------------------------------------------------------------


@SETTINGS
@given(valid_manifests())
def test_valid_manifests_round_trip(scratch, m):
    assume(not has_nan(m))
    assert validate(m) is m
    p = scratch / "manifest.json"
    write_manifest(p, m)
    assert read_manifest(p) == m
    assert json.loads(p.read_text()) == m
    assert not [q for q in scratch.iterdir() if q.name.startswith(".")], "write_manifest left a temporary file"


# ---- one required field wrong --------------------------------------------------------------------


@SETTINGS
@given(valid_manifests(), st.data())
def test_a_required_field_of_the_wrong_type_is_refused_naming_it(m, data):
    path, kind = data.draw(st.sampled_from(required_fields(m)), label="field")
    wrong = data.draw(json_values.filter(lambda v: not is_type(v, kind)), label="value")
    with pytest.raises(FormatError) as info:
        validate(replaced(m, path, wrong))
    assert repr(path[-1]) in str(info.value)
    assert f"has the wrong type ({type(wrong).__name__})" in str(info.value)


@SETTINGS
@given(valid_manifests(), st.data())
def test_a_missing_required_field_is_refused_naming_it(m, data):
    path, _ = data.draw(st.sampled_from(required_fields(m)), label="field")
    with pytest.raises(FormatError, match=f"missing {path[-1]!r}"):
        validate(replaced(m, path, _DELETE))


@settings(SETTINGS, max_examples=50)
@given(valid_manifests(), st.integers().filter(lambda v: v != FORMAT_VERSION))
def test_another_format_version_is_a_version_error(m, version):
    with pytest.raises(VersionError, match=f"archive format version {version}, this Foundry reads {FORMAT_VERSION}"):
        validate({**m, "version": version})


@settings(SETTINGS, max_examples=50)
@given(valid_manifests(), st.text(max_size=16).filter(lambda f: f != FORMAT_NAME))
def test_another_format_name_is_refused(m, name):
    with pytest.raises(FormatError, match="not a Foundry archive manifest"):
        validate({**m, "format": name})


@settings(SETTINGS, max_examples=50)
@given(valid_manifests(), st.sampled_from(["..", ".", "", "../x", "a/b", "/abs", "a\\b", "x\0"]))
def test_a_payload_name_leaving_the_archive_is_refused(m, name):
    with pytest.raises(FormatError, match="is not a plain file name inside the archive"):
        validate({**m, "payload": name})


# ---- size ------------------------------------------------------------------------------------------


@SETTINGS
@given(valid_manifests(), st.integers(-64, 64))
def test_manifests_over_the_size_limit_are_refused(scratch, m, delta):
    assume(not has_nan(m))
    text = json.dumps(m)
    limit = len(text) + 64  # the file is padded with whitespace to limit + delta bytes
    p = scratch / "manifest.json"
    p.write_text(text + " " * (limit + delta - len(text)))
    with mock.patch.object(manifest_mod, "MAX_MANIFEST_BYTES", limit):
        if delta > 0:
            too_large = f"manifest of {limit + delta} bytes is larger than the {limit} allowed"
            with pytest.raises(FormatError, match=too_large):
                read_manifest(p)
        else:
            assert read_manifest(p) == m


def test_the_real_size_limit(tmp_path):
    p = tmp_path / "manifest.json"
    with open(p, "wb") as f:
        f.truncate(manifest_mod.MAX_MANIFEST_BYTES + 1)  # sparse: nothing is written
    with pytest.raises(FormatError, match="is larger than"):
        read_manifest(p)


def test_a_missing_manifest_is_an_archive_io_error(tmp_path):
    with pytest.raises(ArchiveIOError, match="no such manifest"):
        read_manifest(tmp_path / "manifest.json")


# ---- pinned defects ----------------------------------------------------------------------------------


def test_deeply_nested_manifest_is_refused(tmp_path):
    p = tmp_path / "manifest.json"
    p.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(FormatError):
        read_manifest(p)


def test_manifest_with_a_huge_integer_is_refused(tmp_path):
    assert sys.get_int_max_str_digits() > 0
    p = tmp_path / "manifest.json"
    p.write_text(json.dumps({"format": FORMAT_NAME, "version": 1}).replace(": 1}", ": " + "1" * 5000 + "}"))
    with pytest.raises(FormatError):
        read_manifest(p)


def test_write_manifest_replaces_atomically(tmp_path):
    """The old manifest stays whole until the new one is complete (temporary file then rename)."""
    p = tmp_path / "manifest.json"
    good = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "fingerprint": {}, "payload": "graphs.fgr",
            "region": {"base": 0, "size": 0, "high_water": 0}, "graphs": []}
    write_manifest(p, good)
    inode = os.stat(p).st_ino
    with pytest.raises(TypeError):
        write_manifest(p, {**good, "bad": object()})  # fails while serialising
    assert read_manifest(p) == good and os.stat(p).st_ino == inode

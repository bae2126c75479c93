"""The host paths in vLLM's compile-cache key, taken as at SAVE when a LOAD computes that key.

vLLM 0.25 names its compiled model's directory (``torch_compile_cache/torch_aot_compile/<hash>``,
which the archive carries: compile_cache.py) by a key over every vLLM environment variable it
knows except those it lists as ignored (``vllm/envs.py`` ``compile_factors``). Two of the hashed
ones are paths that, when unset, vLLM derives from the host's directories, and that no compiled
code depends on:

- ``VLLM_XLA_CACHE_PATH``: ``$XDG_CACHE_HOME/vllm/xla_cache`` (default ``~/.cache``). Nothing
  else in vLLM 0.25 reads it on a GPU; it was the TPU backend's cache.
- ``VLLM_CONFIG_ROOT``: ``$XDG_CONFIG_HOME/vllm`` (default ``~/.config``), where vLLM keeps its
  usage statistics and their opt-out.

So on a host whose cache or home directory lies elsewhere, vLLM computes another key, does not
find the compiled model the archive placed, and compiles it again (15-31 s with the Qwen3-8B
shapes on an H100, every start on empty caches at new paths). SAVE records the values its key
hashed (:func:`record`, in the engine state). A LOAD whose archive carries vLLM's compiled model
finds the recorded values that differ here (:func:`match`) and wraps ``compile_factors`` so that
the key hashes SAVE's values for them (:func:`keyed_as_at_save`). The environment is not changed:
vLLM keeps its statistics, and reads everything else, at this host's paths; only the factors vLLM
writes beside its compiled pieces (``cache_key_factors.json``, never read back) show SAVE's.
Newer vLLM releases (0.34) leave both out of the key; then nothing is done.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

logger = logging.getLogger("foundry.vllm")

__all__ = ["STATE_KEY", "PATHS", "record", "match", "keyed_as_at_save", "say_keyed", "say_compiles"]

STATE_KEY = "compile_key_paths"  # in the engine state's adapter fields
PATHS = ("VLLM_XLA_CACHE_PATH", "VLLM_CONFIG_ROOT")  # hashed by vLLM 0.25, read by no compiled code


def record(state: MutableMapping[str, Any], envs: Any,
           keyed: Mapping[str, tuple[str, str]] | None = None) -> None:
    """SAVE: the values of :data:`PATHS` this process's key hashed, into the adapter's ``state``:
    vLLM's ``envs``, or SAVE's where this process's key took them (``keyed``: :func:`match`'s
    answer; a LOAD that fell back to SAVE keeps the key it compiled under)."""
    values = {name: str(value) for name in PATHS if (value := getattr(envs, name, None)) is not None}
    state[STATE_KEY] = {**values, **_saved_values(keyed or {})}


def match(recorded: Mapping[str, Any], envs: Any) -> dict[str, tuple[str, str]]:
    """LOAD: {variable: (SAVE's value, this host's)} for each of :data:`PATHS` whose value here
    differs from the one SAVE recorded (``recorded``: the engine state's adapter fields) and that
    vLLM's key hashes. Empty for an archive from before this record, or a vLLM that leaves them out."""
    saved = recorded.get(STATE_KEY)
    if not isinstance(saved, Mapping):
        return {}
    differ = _differing(saved, envs)
    if differ:
        hashed = _hashed(envs)  # only now: it evaluates every variable vLLM knows
        differ = {name: pair for name, pair in differ.items() if hashed is None or name in hashed}
    return differ


def keyed_as_at_save(differ: Mapping[str, tuple[str, str]]) -> Callable[[Callable[[], dict]], Callable[[], dict]]:
    """The wrapper of vLLM's ``envs.compile_factors`` (seam ``compile.key_env_factors``) that
    puts SAVE's values (from :func:`match`) in place of the factors it names."""
    keyed = _saved_values(differ)

    def wrap(original: Callable[[], dict]) -> Callable[[], dict]:
        @functools.wraps(original)
        def compile_factors() -> dict:
            factors = original()
            for name, value in keyed.items():
                if name in factors:
                    factors[name] = value
            return factors

        return compile_factors

    return wrap


def say_keyed(differ: Mapping[str, tuple[str, str]]) -> None:
    """Logs each variable the key now hashes with SAVE's value."""
    for name, (value, here) in differ.items():
        logger.info("foundry: vLLM's compile-cache key takes SAVE's %s=%s (%s here): a host path no compiled code "
                    "depends on; the compiled model from the archive is found, and vLLM still uses %s", name, value,
                    here, here)


def say_compiles(differ: Mapping[str, tuple[str, str]], why: str) -> None:
    """Logs that vLLM compiles because its key could not take SAVE's values (``why``), and how
    a user makes the keys match."""
    settings = " ".join(f"{name}={value}" for name, (value, _) in differ.items())
    here = ", ".join(f"{name} is {here} here" for name, (_, here) in differ.items())
    logger.warning("foundry: vLLM compiles the model instead of using the archive's: its compile-cache key hashes "
                   "host paths that differ from SAVE's (%s) and %s; start with %s to use it", here, why, settings)


def _saved_values(differ: Mapping[str, tuple[str, str]]) -> dict[str, str]:
    return {name: value for name, (value, _) in differ.items()}


def _differing(saved: Mapping[str, Any], envs: Any) -> dict[str, tuple[str, str]]:
    """{variable: (SAVE's value, this host's)} for each recorded one whose value here differs."""
    differ = {}
    for name in PATHS:
        value, here = saved.get(name), getattr(envs, name, None)
        if isinstance(value, str) and here is not None and value != str(here):
            differ[name] = (value, str(here))
    return differ


def _hashed(envs: Any) -> set[str] | None:
    """The variables vLLM's compile-cache key hashes (a vLLM after 0.25 ignores these paths), or
    None when this vLLM does not say."""
    factors = getattr(envs, "compile_factors", None)
    try:
        return set(factors()) if callable(factors) else None
    except Exception:  # noqa: BLE001 - vLLM's own helper failing: assume the key has them, as 0.25's does
        return None

"""The host paths in vLLM's compile-cache key, made the same at LOAD as at SAVE.

vLLM 0.25 keys its AOT compile cache (``torch_compile_cache/torch_aot_compile/<hash>``, which the
archive carries: compile_cache.py) on every vLLM environment variable it knows except those it
lists as ignored (``vllm/envs.py`` ``compile_factors``). Two of the hashed ones are paths that,
when unset, vLLM derives from the host's directories:

- ``VLLM_XLA_CACHE_PATH``: ``$XDG_CACHE_HOME/vllm/xla_cache`` (default ``~/.cache``). Nothing else
  in vLLM 0.25 reads it; it was the TPU backend's cache.
- ``VLLM_CONFIG_ROOT``: ``$XDG_CONFIG_HOME/vllm`` (default ``~/.config``), where vLLM looks for
  its usage-statistics opt-out.

So on a host whose cache directory (or configuration directory) lies elsewhere, vLLM computes
another key, does not find the compiled model the archive placed, and compiles it again (20-31 s
with the Qwen3-8B shapes on an H100, every start on empty caches at new paths). SAVE records the values it hashed
(:func:`record`, in the engine state). LOAD, before vLLM compiles (:func:`match`), sets
``VLLM_XLA_CACHE_PATH`` to SAVE's value where the user has not set it and the archive carries
vLLM's compiled model, and says so. A ``VLLM_CONFIG_ROOT`` that differs (another home or
``XDG_CONFIG_HOME``), or a ``VLLM_XLA_CACHE_PATH`` the user set to another value, is named, not
changed: setting it to SAVE's value makes the keys match. Newer vLLM releases (0.34) leave
both out of the key; then nothing is done.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, MutableMapping
from typing import Any

logger = logging.getLogger("foundry.vllm")

__all__ = ["STATE_KEY", "PINNED", "NAMED", "record", "match"]

STATE_KEY = "compile_key_paths"  # in the engine state's adapter fields
PINNED = ("VLLM_XLA_CACHE_PATH",)  # set to SAVE's value at LOAD: read by nothing else on a GPU
NAMED = ("VLLM_CONFIG_ROOT",)  # only named when it differs: it is vLLM's configuration directory


def record(state: MutableMapping[str, Any], envs: Any) -> None:
    """SAVE: the values vLLM's ``envs`` gives the variables of :data:`PINNED` and :data:`NAMED`,
    into the adapter's ``state``."""
    state[STATE_KEY] = {name: str(value) for name in (*PINNED, *NAMED)
                        if (value := getattr(envs, name, None)) is not None}


def match(recorded: Mapping[str, Any], envs: Any, environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """LOAD: sets each variable of :data:`PINNED` the user left unset (in ``environ``, default
    os.environ) whose value here differs from SAVE's (``recorded``: the engine state's adapter
    fields) to SAVE's, and names each of :data:`NAMED` that differs. Returns what it set. An
    archive from before this record sets nothing."""
    environ = os.environ if environ is None else environ
    saved = recorded.get(STATE_KEY)
    if not isinstance(saved, Mapping):
        return {}
    differ = _differing(saved, envs)
    if differ:
        hashed = _hashed(envs)  # only now: it evaluates every variable vLLM knows
        differ = {name: pair for name, pair in differ.items() if hashed is None or name in hashed}
    changed: dict[str, str] = {}
    for name, (value, here) in differ.items():
        if name in PINNED and name not in environ:
            environ[name] = changed[name] = value
            logger.info("foundry: %s=%s, as at SAVE (%s here): part of vLLM's compile-cache key, and read by nothing "
                        "else on a GPU; the compiled model from the archive is found", name, value, here)
        else:  # set by the user, or NAMED
            logger.warning("foundry: %s is %s here and was %s at SAVE; vLLM's compile-cache key includes it, so vLLM "
                           "compiles the model instead of using the archive's (set %s=%s to use it)", name, here,
                           value, name, value)
    return changed


def _differing(saved: Mapping[str, Any], envs: Any) -> dict[str, tuple[str, str]]:
    """{variable: (SAVE's value, this host's)} for each recorded one whose value here differs."""
    differ = {}
    for name in (*PINNED, *NAMED):
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

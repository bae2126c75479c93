"""FlashInfer JIT modules from the archive, used as built where this host's FlashInfer cache is at
another path than the saving host's.

FlashInfer 0.6.15 (``flashinfer/jit/core.py``) loads a JIT module through
``JitSpec.build_and_load``, which first runs ninja in the module's build directory. Ninja's
records there (``build.ninja``, ``.ninja_log``, ``.ninja_deps``) name the module's files by
absolute path. Placed under another cache root (another ``FLASHINFER_WORKSPACE_BASE`` or home
directory), they name no file of this host, so ninja rebuilds the module: nvcc, about half a
minute for the norm module SGLang's one-token prefill uses, at a server's first requests.

So where the root differs, a LOAD places the carried modules anyway and makes FlashInfer load a
module's library without ninja when two things hold, checked when FlashInfer asks for it, under
FlashInfer's own lock for the module:

- the file at the library's path is the library the archive carries, byte for byte (its size and
  SHA-256 as the archive lists them): FlashInfer built it from the same sources on the saving host
  (the path names FlashInfer's version and the GPU architecture, the archive's fingerprint the
  driver, CUDA and GPU);
- each source file the carried ``build.ninja`` compiles exists on this host and is not newer than
  that library (ninja's own test for its inputs; a generated source under the cache is looked for
  under this host's root).

Any other module, or a library that differs, goes through FlashInfer's own ``build_and_load``.
Where the roots are the same, nothing here is used: ninja's records are valid and ninja decides.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any

from foundry_core.cache_list import file_digest, open_regular
from foundry_core.engine.host_caches import CacheTree, HostCaches

logger = logging.getLogger("foundry")

__all__ = ["CarriedBuilds", "install", "relocate"]

FLASHINFER = "flashinfer"  # the cache's name in the archive (foundry_core.engine.jit_dirs)
CORE_MODULE = "flashinfer.jit.core"
_BUILT = "cached_ops"
_COMPILE_RULES = ("compile", "cuda_compile")
_WRAPPED = "__foundry_carried_builds__"


class CarriedBuilds:
    """The FlashInfer modules ``source`` carries (``<version>/<arch>/cached_ops/<name>/<name>.so``),
    by name; ``saved_root`` and ``root``: FlashInfer's cache on the saving host and on this one."""

    def __init__(self, source: HostCaches, saved_root: str, root: Path) -> None:
        self.source = source
        self.saved_root = saved_root
        self.root = Path(root)
        self.libraries: dict[str, str] = {}  # module name -> the library's path in the cache
        for rel in source.paths(FLASHINFER):
            parts = PurePosixPath(rel).parts
            if len(parts) == 5 and parts[2] == _BUILT and parts[4] == f"{parts[3]}.so":
                self.libraries[parts[3]] = rel

    def matches(self, name: str, library: Path) -> bool:
        """Whether ``library`` is module ``name``'s carried library and its sources are not newer
        (see the module); False, never an error, otherwise."""
        rel = self.libraries.get(name)
        if rel is None:
            return False
        entry = self.source.entries[FLASHINFER][rel]
        try:
            stat = os.stat(library)
            if stat.st_size != entry.size or file_digest(library) != entry:
                return False
            stale = [src for src in self._sources(rel) if not self._older(src, stat.st_mtime_ns)]
        except (OSError, ValueError, KeyError) as exc:
            logger.debug("foundry: FlashInfer's %s is built by FlashInfer (%s)", name, exc)
            return False
        if stale:
            logger.info("foundry: FlashInfer's %s module is rebuilt: %s is newer than the archive's build or missing",
                        name, stale[0])
            return False
        return True

    def _sources(self, library_rel: str) -> list[Path]:
        """The inputs of the carried ``build.ninja``'s compile edges, at their place on this host."""
        rel = str(PurePosixPath(library_rel).parent / "build.ninja")
        entry = self.source.entries[FLASHINFER][rel]
        with os.fdopen(open_regular(self.source.root / entry.sha256, entry.size), "rb") as f:
            content = f.read()
        if hashlib.sha256(content).hexdigest() != entry.sha256:
            raise ValueError(f"the archive's {rel} is not the listed bytes")
        return [self._here(src) for src in _compiled_sources(content.decode())]

    def _here(self, path: str) -> Path:
        saved = os.path.join(self.saved_root, "")
        return self.root / path[len(saved):] if path.startswith(saved) else Path(path)

    @staticmethod
    def _older(source: Path, library_mtime_ns: int) -> bool:
        return os.stat(source).st_mtime_ns <= library_mtime_ns


def _compiled_sources(build_ninja: str) -> list[str]:
    """``build OUT: compile|cuda_compile SRC`` lines' sources (FlashInfer writes one per line, with
    absolute paths and no escapes)."""
    sources = []
    for line in build_ninja.splitlines():
        if not line.startswith("build "):
            continue
        _, _, rest = line.partition(": ")
        rule, *inputs = rest.split()
        if rule in _COMPILE_RULES:
            sources.extend(inputs)
    if not sources:
        raise ValueError("the carried build.ninja compiles nothing")
    return sources


def install(builds: CarriedBuilds, core: Any = None) -> bool:
    """Wraps FlashInfer's ``JitSpec.build_and_load`` (``core``: the imported ``flashinfer.jit.core``,
    default the process's) to load ``builds``' modules as built; False when FlashInfer is not
    imported or its loader is not the one described in the module (then FlashInfer builds as
    usual). Installing again replaces the builds."""
    core = sys.modules.get(CORE_MODULE) if core is None else core
    spec = getattr(core, "JitSpec", None)
    current = getattr(spec, "build_and_load", None)
    lock = getattr(core, "FileLock", None)
    if spec is None or not callable(current) or lock is None:
        return False
    holder = getattr(current, _WRAPPED, None)
    if holder is not None:
        holder[0] = builds
        return True
    original = current
    holder = [builds]

    @functools.wraps(original)
    def build_and_load(self: Any) -> Any:
        try:
            carried = not self.is_aot and holder[0].libraries.get(self.name) is not None
        except AttributeError:
            carried = False
        if carried:
            library = Path(self.jit_library_path)
            with lock(self.lock_path, thread_local=False):
                if holder[0].matches(self.name, library):
                    logger.info("foundry: FlashInfer's %s module taken from the archive as built, without ninja "
                                "(FlashInfer's cache is at %s here, at %s on the saving host)", self.name,
                                holder[0].root, holder[0].saved_root)
                    return self.load(library)
        return original(self)

    setattr(build_and_load, _WRAPPED, holder)
    spec.build_and_load = build_and_load
    return True


def relocate(tree: CacheTree, source: HostCaches, core: Any = None) -> CacheTree:
    """``tree`` as LOAD places it: FlashInfer's cache at another root than the saving host's, with
    modules carried and the loader wrapped (:func:`install`), is placed there too
    (``relocatable``); any other tree is returned as it is."""
    saved = source.roots.get(tree.cache)
    if tree.cache != FLASHINFER or not tree.bound_to_root or saved is None or saved == os.path.realpath(tree.root):
        return tree
    builds = CarriedBuilds(source, saved, tree.root)
    if not builds.libraries:
        return tree
    if not install(builds, core):  # the tree stays bound to its root; placing it says why not
        logger.debug("foundry: FlashInfer's loader is not imported or not the one described in %s", __name__)
        return tree
    return replace(tree, relocatable=True)

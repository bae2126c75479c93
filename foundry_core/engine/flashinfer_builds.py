"""FlashInfer JIT modules from the archive, used as built where this host's FlashInfer cache is at
another path than the saving host's.

FlashInfer 0.6.15 (``flashinfer/jit/core.py``) loads a JIT module through
``JitSpec.build_and_load``, which first runs ninja in the module's build directory. Ninja's
records there (``build.ninja``, ``.ninja_log``, ``.ninja_deps``) name the module's files by
absolute path. Placed under another cache root (another ``FLASHINFER_WORKSPACE_BASE`` or home
directory), they name no file of this host, so ninja rebuilds the module with nvcc at the first
request that needs it (SGLang's one-token prefill outside its graphs calls FlashInfer's norm).

So where the root differs, a LOAD places the carried modules anyway and makes FlashInfer load a
module's library without ninja when all of this holds, checked when FlashInfer asks for the
module, under FlashInfer's own lock for it:

- the file at the library's path is the library the archive carries there, byte for byte (its
  size and SHA-256 as the archive lists them);
- the ``build.ninja`` FlashInfer writes for the module on this host (as its build does first) is
  the carried one with the saving host's root replaced by this one's: the same sources, compiler,
  toolkit path and flags;
- each source it compiles exists and is not newer than the library (ninja's test for an input).

Ninja would also rebuild for a header newer than its records; headers are not compared here (the
path names FlashInfer's version and the GPU architecture, and the archive's fingerprint the
driver, CUDA and GPU). Any other module, a check that fails or a library that does not load goes
through FlashInfer's own ``build_and_load``. Where the roots are the same, nothing here is used:
ninja's records are valid and ninja decides.
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
from foundry_core.engine.jit_dirs import BUILT, FLASHINFER

logger = logging.getLogger("foundry")

__all__ = ["CarriedBuilds", "install", "relocate"]

CORE_MODULE = "flashinfer.jit.core"
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
            if len(parts) == 5 and parts[2] == BUILT and parts[4] == f"{parts[3]}.so":
                self.libraries[parts[3]] = rel

    def matches(self, name: str, library: Path, build_ninja: str) -> bool:
        """Whether ``library`` is module ``name``'s carried library, at its carried place, and
        ``build_ninja`` (what FlashInfer writes for it on this host) is the carried one at this
        root, with no source newer than the library (see the module); False otherwise. Raises
        nothing but what reading the archive raises (the caller falls back on any error)."""
        rel = self.libraries.get(name)
        if rel is None or os.path.realpath(library) != os.path.realpath(self.root / rel):
            return False
        entry = self.source.entries[FLASHINFER][rel]
        stat = os.stat(library)
        if stat.st_size != entry.size or file_digest(library) != entry:
            logger.info("foundry: FlashInfer's %s module is built by FlashInfer: %s is not the archive's library "
                        "(this host's own build)", name, library)
            return False
        if build_ninja != self._carried_build_ninja(rel):
            logger.info("foundry: FlashInfer's %s module is rebuilt: this host builds it with other commands or "
                        "sources than the saving host", name)
            return False
        stale = [src for src in _compiled_sources(build_ninja) if not _older(Path(src), stat.st_mtime_ns)]
        if stale:
            logger.info("foundry: FlashInfer's %s module is rebuilt: %s is missing or newer than the archive's "
                        "build", name, stale[0])
            return False
        return True

    def _carried_build_ninja(self, library_rel: str) -> str:
        """The carried ``build.ninja`` of the module, with the saving host's root as this one's."""
        rel = str(PurePosixPath(library_rel).parent / "build.ninja")
        entry = self.source.entries[FLASHINFER][rel]
        with os.fdopen(open_regular(self.source.root / entry.sha256, entry.size), "rb") as f:
            content = f.read()
        if hashlib.sha256(content).hexdigest() != entry.sha256:
            raise ValueError(f"the archive's {rel} is not the listed bytes")
        return content.decode().replace(os.path.join(self.saved_root, ""),
                                        os.path.join(os.path.realpath(self.root), ""))


def _older(source: Path, library_mtime_ns: int) -> bool:
    """Whether ``source`` exists and is not newer than the library (ninja's test for an input)."""
    try:
        return os.stat(source).st_mtime_ns <= library_mtime_ns
    except OSError:
        return False


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
            loaded, module = _load_carried(self, holder[0], lock)
            if loaded:
                return module
        except Exception as exc:  # noqa: BLE001 - FlashInfer's own build decides, as without the archive
            logger.info("foundry: FlashInfer's %s module is built by FlashInfer (taking the archive's failed: "
                        "%s: %s)", getattr(self, "name", "?"), type(exc).__name__, exc)
        return original(self)

    setattr(build_and_load, _WRAPPED, holder)
    spec.build_and_load = build_and_load
    return True


def _load_carried(spec: Any, builds: CarriedBuilds, lock: Any) -> tuple[bool, Any]:
    """(True, the module) when FlashInfer's ``spec`` is carried and passes the checks, loaded as
    FlashInfer loads a build: under its lock for the module, after it wrote its ``build.ninja``
    for this host (as its build does first); (False, None) otherwise."""
    if spec.is_aot or spec.name not in builds.libraries:
        return False, None
    with lock(spec.lock_path, thread_local=False):
        spec.write_ninja()
        library = Path(spec.jit_library_path)
        if not builds.matches(spec.name, library, Path(spec.ninja_path).read_text()):
            return False, None
        module = spec.load(library)
    logger.info("foundry: FlashInfer's %s module taken from the archive as built, without ninja (FlashInfer's cache "
                "is at %s here, at %s on the saving host)", spec.name, builds.root, builds.saved_root)
    return True, module


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
    if not install(builds, core):  # the tree stays bound to its root; placing it says so too
        logger.info("foundry: FlashInfer's loader is not imported in this process, or is not the one %s knows; "
                    "the archive's FlashInfer modules stay for its builds at %s", __name__, saved)
        return tree
    return replace(tree, relocatable=True)

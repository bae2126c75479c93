"""trtllm-foundry's start-up hook: run by ``trtllm-foundry.pth`` in every Python interpreter.

TensorRT-LLM offers no plugin entry point and its arguments reject unknown keys, so the plugin
attaches by patching TensorRT-LLM's modules as they are imported (``trtllm_foundry.importhook``).
Every interpreter runs this module at start-up: shells, compilers, the ``trtllm-serve`` process and
the workers MPI spawns with ``sys.executable``. So it imports nothing beyond ``os`` and ``sys``
unless ``FOUNDRY_ARCHIVE`` or a ``--foundry-*`` flag is there; then it decides with foundry-core's
start-up hook (``_foundry_autopreload``, which that hook's own .pth has loaded already) and imports
the plugin only when Foundry is active. It never raises.

Foundry is active when an archive is named (``--foundry-archive DIR`` on the command line, or
``FOUNDRY_ARCHIVE``) and the mode (``--foundry-mode`` / ``FOUNDRY_MODE``) is not ``off``, as
foundry-core's start-up hook (``_foundry_autopreload``) decides it;
``FOUNDRY_TRTLLM_HOOK=0`` turns the hook off. Flags on the command line are exported as
``FOUNDRY_ARCHIVE`` (absolute) / ``FOUNDRY_MODE`` at once, so every process started later
(TensorRT-LLM's MPI workers) resolves the same settings. Then the import hook is installed; it
never imports TensorRT-LLM itself.
"""

from __future__ import annotations

import os
import sys

DISABLE_ENV = "FOUNDRY_TRTLLM_HOOK"
ARCHIVE_ENV = "FOUNDRY_ARCHIVE"
MODE_ENV = "FOUNDRY_MODE"
_FALSE = ("0", "false", "no", "off")


def export_flags(argv: list[str], environ: dict[str, str] | os._Environ) -> None:
    """Writes ``--foundry-archive`` / ``--foundry-mode`` of ``argv`` to ``environ`` (flags win)."""
    from _foundry_autopreload import ARCHIVE_FLAG, MODE_FLAG, flag_value

    archive = flag_value(argv, ARCHIVE_FLAG)
    if archive:
        environ[ARCHIVE_ENV] = os.path.abspath(os.path.expanduser(archive))
    mode = flag_value(argv, MODE_FLAG)
    if mode:
        environ[MODE_ENV] = mode.strip().lower()


def start() -> bool:
    """The .pth entry: exports the command line's Foundry flags and, when Foundry is active,
    installs the import hook. Returns whether it did; never raises (start-up must go on)."""
    try:
        argv = list(getattr(sys, "argv", None) or [])
        if os.environ.get(DISABLE_ENV, "").strip().lower() in _FALSE:
            return False
        if not os.environ.get(ARCHIVE_ENV, "").strip() and not any(a.startswith("--foundry-") for a in argv):
            return False  # the common case: Foundry is not asked for, nothing more is looked at
        # foundry-core's own start-up hook (imported by its .pth before this one: only os and sys)
        # reads the same flags and environment to decide whether to restart under the preload.
        from _foundry_autopreload import wants_foundry

        export_flags(argv, os.environ)
        if not wants_foundry(argv, os.environ):
            return False
        from trtllm_foundry import importhook  # only now: Foundry is active in this process

        importhook.install()
        return True
    except Exception as exc:  # noqa: BLE001 - never break interpreter start-up
        sys.stderr.write(f"trtllm-foundry: the start-up hook failed ({type(exc).__name__}: {exc}); TensorRT-LLM "
                         f"runs without Foundry. {DISABLE_ENV}=0 silences this.\n")
        return False

"""trtllm-foundry's start-up hook: run by ``trtllm-foundry.pth`` in every Python interpreter.

TensorRT-LLM offers no plugin entry point and its arguments reject unknown keys, so the plugin
attaches by patching TensorRT-LLM's modules as they are imported (``trtllm_foundry.importhook``).
Every interpreter runs this module at start-up: shells, compilers, the ``trtllm-serve`` process and
the workers MPI spawns with ``sys.executable``. So it imports nothing beyond ``os`` and ``sys``
until it has decided that Foundry is active, and it never raises.

Foundry is active when an archive is named (``--foundry-archive DIR`` on the command line, or
``FOUNDRY_ARCHIVE``) and the mode (``--foundry-mode`` / ``FOUNDRY_MODE``) is not ``off``;
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
ARCHIVE_FLAG = "--foundry-archive"
MODE_FLAG = "--foundry-mode"
_FALSE = ("0", "false", "no", "off")


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value of ``flag`` in ``argv`` (``--flag V`` or ``--flag=V``; the last one wins), or
    None when absent."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag:
            value = argv[i + 1] if i + 1 < len(argv) else ""
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1:]
    return value


def export_flags(argv: list[str], environ: dict[str, str] | os._Environ) -> None:
    """Writes ``--foundry-archive`` / ``--foundry-mode`` of ``argv`` to ``environ`` (flags win)."""
    archive = flag_value(argv, ARCHIVE_FLAG)
    if archive:
        environ[ARCHIVE_ENV] = os.path.abspath(os.path.expanduser(archive))
    mode = flag_value(argv, MODE_FLAG)
    if mode:
        environ[MODE_ENV] = mode.strip().lower()


def active(environ: dict[str, str] | os._Environ) -> bool:
    """Whether Foundry is asked for: an archive, a mode other than off, and the hook not disabled."""
    if environ.get(DISABLE_ENV, "").strip().lower() in _FALSE:
        return False
    if environ.get(MODE_ENV, "").strip().lower() == "off":
        return False
    return bool(environ.get(ARCHIVE_ENV, "").strip())


def start() -> bool:
    """The .pth entry: exports the command line's Foundry flags and, when Foundry is active,
    installs the import hook. Returns whether it did; never raises (start-up must go on)."""
    try:
        argv = list(getattr(sys, "argv", None) or [])
        if ARCHIVE_FLAG in " ".join(argv) or MODE_FLAG in " ".join(argv):
            export_flags(argv, os.environ)
        if not active(os.environ):
            return False
        from trtllm_foundry import importhook  # only now: Foundry is active in this process

        importhook.install()
        return True
    except Exception as exc:  # noqa: BLE001 - never break interpreter start-up
        sys.stderr.write(f"trtllm-foundry: the start-up hook failed ({type(exc).__name__}: {exc}); TensorRT-LLM "
                         f"runs without Foundry. {DISABLE_ENV}=0 silences this.\n")
        return False

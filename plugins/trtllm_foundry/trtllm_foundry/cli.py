"""``--foundry-archive DIR`` and ``--foundry-mode auto|save|load|off`` as ``trtllm-serve`` options.

``trtllm-serve`` is a click program (TensorRT-LLM 1.2 ``commands/serve.py``: ``@click.command("serve")``
``def serve(model, ...)``, added to the ``main`` group). Its settings end in ``TorchLlmArgs``, which
forbid unknown keys, so the options cannot travel there: the start-up hook already exported them
from the command line as ``FOUNDRY_ARCHIVE`` / ``FOUNDRY_MODE`` when the interpreter started (so
the MPI workers inherit them), and this module adds the two options to the click command in place,
so that click accepts them and ``trtllm-serve --help`` lists them; its callback gets them removed
and exported again (flags win over the environment; a bad mode is an error here). The command
object is changed, not replaced: the ``main`` group holds it by reference.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from foundry_core.engine import flags
from foundry_core.engine.mode import CHOICES, resolve_settings

from trtllm_foundry import patching, seams

logger = logging.getLogger("foundry.tensorrt_llm")

SEAM = "cli.serve"
PARAMS = ("foundry_archive", "foundry_mode")
MARKER = "__foundry_cli__"

__all__ = ["SEAM", "PARAMS", "install", "uninstall", "options_for", "wrap_callback"]


def options_for(click: Any) -> list[Any]:
    """The two click options: the flag names of foundry_core.engine.flags, with shorter help that names
    the plugin."""
    return [
        click.Option([flags.ARCHIVE_FLAG, PARAMS[0]], type=str, default=None, metavar="DIR",
                     help="Foundry archive directory (default: $FOUNDRY_ARCHIVE). Without an archive Foundry is off "
                          "(trtllm-foundry)."),
        click.Option([flags.MODE_FLAG, PARAMS[1]], type=click.Choice(list(CHOICES)), default=None,
                     help="auto: load a complete archive, else capture and save one (default; $FOUNDRY_MODE); save, "
                          "load, or off (trtllm-foundry)."),
    ]


def wrap_callback(callback: Callable[..., Any]) -> Callable[..., Any]:
    """The command's callback without the two options, which it exports first."""

    def serve(*args: Any, **kwargs: Any) -> Any:
        archive, mode = kwargs.pop(PARAMS[0], None), kwargs.pop(PARAMS[1], None)
        if archive is not None or mode is not None:
            flags.export(resolve_settings(mode, archive))
        return callback(*args, **kwargs)

    setattr(serve, MARKER, callback)
    return serve


def _command() -> Any:
    command = patching.resolve(SEAM)[2]
    if not isinstance(getattr(command, "params", None), list) or not callable(getattr(command, "callback", None)):
        raise patching.error(SEAM, f"is a {type(command).__name__}, expected a click command")
    return command


def install(module: str | None = None) -> bool:
    """Adds the options to ``trtllm-serve``'s command once; False when they are there already.
    When the command moved: a warning (FOUNDRY_ARCHIVE / FOUNDRY_MODE still work)."""
    if module is not None and module != seams.seam(SEAM).module:
        return False
    try:
        command = _command()
        import click
    except (patching.SeamError, ImportError) as exc:
        logger.warning("foundry: %s; %s and %s are unavailable, set FOUNDRY_ARCHIVE / FOUNDRY_MODE instead", exc,
                       flags.ARCHIVE_FLAG, flags.MODE_FLAG)
        return False
    if hasattr(command.callback, MARKER):
        return False
    command.params.extend(options_for(click))
    command.callback = wrap_callback(command.callback)
    return True


def uninstall() -> None:
    """Takes the options out again (tests)."""
    command = _command()
    original = getattr(command.callback, MARKER, None)
    if original is not None:
        command.callback = original
        command.params[:] = [p for p in command.params if getattr(p, "name", None) not in PARAMS]

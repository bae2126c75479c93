"""sglang-foundry: SGLang starts from a Foundry archive of its decode CUDA graphs (no fork, no edits).

Installed, it registers under SGLang's ``sglang.srt.plugins`` entry point
(``sglang_foundry.register:register``). This package imports nothing itself: the start-up hook
imports ``fork_server.py`` before anything else, and the fork server starts sooner without the
engine layer's imports (0.2-0.36 s), which SGLang's plugin load does anyway.
``python -m sglang.launch_server ... --foundry-archive DIR`` (or ``FOUNDRY_ARCHIVE=DIR`` for the
offline ``sglang.Engine`` API): the first start captures as usual and writes the archive, later
starts restore it. Everything here imports without SGLang; SGLang is imported only by the seams.
Each module imports only those below it: the settings and the seams at the bottom, the mode
checks, the adapter, the runtime, the patches, the activation and the CLI seam, and register (the
entry point) on top.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]

"""trtllm-foundry: TensorRT-LLM (PyTorch backend) starts from a Foundry archive of its decode CUDA graphs.

TensorRT-LLM has no plugin entry point, so the plugin attaches through a start-up hook:
``trtllm-foundry.pth`` runs ``_trtllm_foundry_hook.start()`` in every interpreter, which does
nothing unless an archive is named (``FOUNDRY_ARCHIVE=DIR``, or ``trtllm-serve ... --foundry-archive
DIR``) and then installs :mod:`trtllm_foundry.importhook`, which patches TensorRT-LLM's modules as
they are imported (the seams are listed in :mod:`trtllm_foundry.seams`). The first start captures as
usual and writes the archive, later starts restore it.

Importing this package never imports TensorRT-LLM (nor the patch modules).
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__", "install"]


def install() -> None:
    """Installs the import hook in this process (what the start-up hook does when Foundry is active)."""
    from trtllm_foundry import importhook

    importhook.install()

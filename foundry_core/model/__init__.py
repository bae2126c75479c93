"""The built-in decoder model used by `foundry demo` and `foundry bench` (random weights, no download).

``DecodeRunner`` (in ``foundry_core.model.decoder``) needs PyTorch; the shapes here do not.
"""

from foundry_core.model.config import SHAPES, DecoderConfig

__all__ = ["DecoderConfig", "SHAPES"]

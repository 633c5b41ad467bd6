"""Importing torchvision (which timm and transformers' export integration import) on any torch build.

torchvision's wheel on PyPI is a CUDA build: on a CPU build of torch its ops library (nms, roi_align...) does not load,
and its import then fails where it registers a fake implementation for `torchvision::nms` and `qnms` regardless. The
models here
use none of those ops, so where the library did not load, the op's schema is declared and the import goes on.
"""

from __future__ import annotations

import sys

import torch


def _import_torchvision() -> None:
    try:
        import torchvision  # noqa: F401
    except ModuleNotFoundError:  # not installed: nothing imports it
        return
    except RuntimeError as exc:
        if "torchvision::nms" not in str(exc):
            raise
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        for op in ("nms", "qnms"):
            if not hasattr(torch.ops.torchvision, op):
                _FRAGMENT.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        import torchvision  # noqa: F401


_FRAGMENT = torch.library.Library("torchvision", "FRAGMENT")
_import_torchvision()

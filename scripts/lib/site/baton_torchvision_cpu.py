"""torchvision's image transforms beside a CPU-only torch (the serve environment on CPU machines).

vLLM's vision-language models (Qwen2/2.5/3-VL, LLaVA, ...) build their Hugging Face processors, and those
(Qwen3-VL's video processor at least) require torchvision. The registry has no CPU build of torchvision: its
manylinux wheel is built against CUDA torch, so its C++ ops (`_C.so`: nms, roi_align, ...; it needs
libtorch_cuda.so) do not load beside torch+cpu. torchvision tolerates that everywhere but in two lines:
`_meta_registrations` registers fake kernels for `torchvision::nms` and `torchvision::qnms` unguarded, and
`import torchvision` fails with "operator torchvision::nms does not exist" (pytorch/vision#9085). This module,
run at interpreter start by baton_torchvision_cpu.pth (scripts/setup.sh copies both into site-packages), declares
those two operators' schemas — only when the C++ ops did not load, just before that module runs — so that the
import succeeds. Nothing gets a kernel: torchvision.ops.nms still says "Couldn't load custom C++ ops"; the
transforms the processors use are plain torch. Standard library only until torchvision is imported.
"""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any

#: the schemas torchvision's C++ library declares for the two operators registered unguarded
SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
#: the library holding the declarations (they last as long as it does)
_library: Any = None


def declare_missing() -> bool:
    """Declare SCHEMAS when torchvision's C++ ops did not load; True when it declared them."""
    global _library
    import torch
    import torchvision.extension

    if torchvision.extension._has_ops() or _library is not None:
        return False
    _library = torch.library.Library("torchvision", "FRAGMENT")
    for schema in SCHEMAS:
        _library.define(schema)
    return True


class _BeforeMetaRegistrations(importlib.abc.MetaPathFinder):
    """Runs declare_missing when `torchvision._meta_registrations` is about to be imported (torchvision's
    __init__ imports `extension`, which tries to load the C++ ops, first), then steps aside."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "torchvision._meta_registrations":
            sys.meta_path.remove(self)
            declare_missing()
        return None


def install() -> None:
    if "torchvision" not in sys.modules and not any(isinstance(f, _BeforeMetaRegistrations) for f in sys.meta_path):
        sys.meta_path.insert(0, _BeforeMetaRegistrations())

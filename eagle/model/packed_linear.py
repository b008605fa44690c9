"""Fast float32 linears on the CPU: oneDNN pre-packed weights (the kernels of inductor's CPU freezing).

Why: on the CPU the default float32 matmul (MKL sgemm) reads the weight once per input row for small
row counts, so a target forward over a small tree costs almost (rows x) one decode step. oneDNN with
a weight reordered once into its blocked layout reads it once for all rows. Measured here (AMD EPYC,
one thread, 576 -> 1536): 1 row 64 us / 65 us, 5 rows 271 us / 70 us, 9 rows 359 us / 115 us (MKL /
packed); the whole default target over 9 tree tokens on a 300-token cache 161 ms -> 79 ms, one decode
step 80 ms -> 48 ms (logits within 1.2e-4). Both plain decoding and speculative decoding use it.

The ops are ``torch.ops.mkldnn._reorder_linear_weight`` / ``torch.ops.mkldnn._linear_pointwise``:
internal to PyTorch, maintained for ``torch.compile``'s CPU freezing path. :func:`packing_available`
checks once per process that they exist and agree with ``F.linear`` on a random input; where they do
not, nothing is packed (a warning says so) and the eager path runs.

:class:`PackedLinear` keeps the dense ``weight`` (and ``bias``) parameters, so ``state_dict``,
``.weight.shape`` / ``.dtype`` / ``.device`` and saving work unchanged; the packed copy is an extra
float32 copy of the weight (memory) made from the weight's value when packing (re-pack after changing
weights: :func:`unpack_linears` then :func:`pack_linears`).
"""
from __future__ import annotations

import functools
import warnings

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["PackedLinear", "packing_available", "pack_linears", "unpack_linears", "packed_rows"]


@functools.lru_cache(maxsize=1)
def packing_available() -> bool:
    """True when oneDNN packed float32 linears exist here and match ``F.linear`` (atol 1e-4, rtol 1e-5)."""
    try:
        if not torch.backends.mkldnn.is_available():
            return False
        g = torch.Generator().manual_seed(0)
        w, b = torch.randn(24, 40, generator=g), torch.randn(24, generator=g)
        packed = torch.ops.mkldnn._reorder_linear_weight(w)
        for rows in (1, 5):
            x = torch.randn(rows, 40, generator=g)
            y = torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], "")
            if not torch.allclose(y, F.linear(x, w, b), atol=1e-4, rtol=1e-5):
                return False
        return True
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


class PackedLinear(nn.Module):
    """A float32 CPU ``nn.Linear`` computed with a oneDNN pre-packed copy of its weight.

    Args:
        linear: the ``nn.Linear`` to take over (its ``weight`` / ``bias`` parameters are shared).

    Raises:
        ValueError: a weight that is not float32 on the CPU.
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        w = linear.weight
        if w.dtype != torch.float32 or w.device.type != "cpu":
            raise ValueError(f"PackedLinear needs a float32 CPU weight, got {w.dtype} on {w.device}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.original = [linear]  # a list: not registered as a submodule (no duplicate state_dict keys)
        self._packed = torch.ops.mkldnn._reorder_linear_weight(w.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` float32 ``[..., in]`` -> ``[..., out]`` (= ``F.linear(x, weight, bias)`` within float rounding)."""
        if x.dtype != torch.float32 or x.device.type != "cpu" or torch.is_grad_enabled() and self.weight.requires_grad:
            return F.linear(x, self.weight, self.bias)
        bias = None if self.bias is None else self.bias.detach()
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, self.in_features), self._packed, bias, "none", [], "")
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, packed"


def pack_linears(module: nn.Module) -> int:
    """Replace every float32 CPU ``nn.Linear`` inside ``module`` (and ``module`` itself is left alone)
    by a :class:`PackedLinear` sharing its parameters. Returns how many were packed (0 when
    :func:`packing_available` is False; a warning says why)."""
    if not packing_available():
        warnings.warn("oneDNN packed linears are unavailable or disagree with F.linear here: running eager",
                      RuntimeWarning, stacklevel=2)
        return 0
    count = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.weight.dtype == torch.float32 and child.weight.device.type == "cpu":
                setattr(parent, name, PackedLinear(child))
                count += 1
    return count


def unpack_linears(module: nn.Module) -> int:
    """Undo :func:`pack_linears` inside ``module`` (the original ``nn.Linear`` modules come back)."""
    count = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, PackedLinear):
                setattr(parent, name, child.original[0])
                count += 1
    return count


def packed_rows(weight: torch.Tensor) -> nn.Module | None:
    """A packed linear over the rows ``weight`` (float32 CPU ``[K, H]``), or None where packing is
    unavailable or the weight is not float32 on the CPU (the caller then uses ``F.linear``)."""
    if weight.dtype != torch.float32 or weight.device.type != "cpu" or not packing_available():
        return None
    lin = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    lin.weight = nn.Parameter(weight.detach(), requires_grad=False)
    return PackedLinear(lin)

"""The linear + activation call: ``act(x @ Wᵀ + b)`` in one cuBLASLt epilogue where it computes the model's act.

::

    unfused                                   fused (CUDA, relu / the device's GELU)
    x ─► linear(W, b) ─► y ─► HBM ─► act ─►   x ─► cuBLASLt GEMM + bias + act epilogue ─►
                         (1 write + 1 read + 1 write of the output)   (1 write)

On CUDA, ``torch._addmm_activation(bias, x, Wᵀ, use_gelu=...)`` asks cuBLASLt
for its BIAS+RELU or BIAS+GELU epilogue (PyTorch ``addmm_out_cuda_impl``: the
cuBLASLt path needs a 1-D contiguous bias and both weight dims > 1, and is off
under ``DISABLE_ADDMM_CUDA_LT=1``). cuBLASLt's GELU epilogue may be the tanh
approximation while the model's GELU is exact (they differ by up to ~5e-4), so
the fused path is taken for GELU only where the epilogue computes the model's
variant: it is probed once per device and dtype (``gelu_epilogue_variant``),
never assumed. Every other case runs ``F.linear`` then the activation in place.

``select_linear_act`` is the one decision (its labels are this module's ``WORDS``); ``linear_act`` runs it,
``linear_act_reference`` is the unfused computation, ``TOLERANCES`` the GEMM epilogue's. ``fused_linear_act``
is the call a fused graph names and ``lower_linear_act`` its lowering for lean graphs: the linear family's
chains are that call, and ConvNeXt's lowering makes one for its first linear; both families import it from here
(neither imports the other). The patterns that find these chains, their rewrites and the forms real models
write (addmm, ``x @ W.T + b``, a written-out GELU) are the linear family's (``explorer.fusions.linear``).
"""

from __future__ import annotations

import functools
import os

import torch
import torch.fx

from explorer.fusions import edit
from explorer.fusions.base import Choice, selection
from explorer.fusions.epilogue import EPILOGUE_TOLERANCES, apply_activation, apply_activation_, check, in_place_node
from explorer.graph import aten
from explorer.words import Words

#: What the kernel's selection says to a person (its labels), in English and 中文 (rendered by explorer.ui.i18n).
WORDS = Words("linear_act", {
    "label.lt_relu": ("cuBLASLt GEMM+bias+relu epilogue (1 call: _addmm_activation)",
                      "cuBLASLt GEMM+bias+relu 尾处理（1 次调用：_addmm_activation）"),
    "label.lt_on_device": (("cuBLASLt GEMM+bias+{act} epilogue where the device's epilogue computes {act}, else "
                            "linear + {act} in place (2 kernels)"),
                           "cuBLASLt GEMM+bias+{act} 尾处理（设备的尾处理算的是 {act} 时），否则 linear + 原地 {act}（2 个内核）"),
    "label.lt_gelu": ("cuBLASLt GEMM+bias+{act} epilogue (1 call: _addmm_activation)",
                      "cuBLASLt GEMM+bias+{act} 尾处理（1 次调用：_addmm_activation）"),
    "label.variant": ("linear + {act} in place (2 kernels; the cuBLASLt epilogue computes {variant}, not {act})",
                      "linear + 原地 {act}（2 个内核；cuBLASLt 尾处理算的是 {variant}，不是 {act}）"),
    "label.linear": ("linear (1 kernel)", "linear（1 个内核）"),
    "label.separate": ("linear + {act} in place (2 kernels)", "linear + 原地 {act}（2 个内核）"),
})

#: Activations the call takes (``"none"``: the linear and its bias alone).
LINEAR_ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "tanh", "hardswish", "quick_gelu", "none")
#: PyTorch reads DISABLE_ADDMM_CUDA_LT once per process too (``getDisableAddmmCudaLt``).
_LT_DISABLED = os.environ.get("DISABLE_ADDMM_CUDA_LT") == "1"
_LT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

TOLERANCES = EPILOGUE_TOLERANCES  # see explorer.fusions.epilogue for the error model


# ====================================================================== kernel selection

def gelu_epilogue_variant(device: str | torch.device, dtype: torch.dtype) -> str:
    """Which GELU ``torch._addmm_activation(use_gelu=True)`` computes here: ``"gelu"`` (erf) or ``"gelu_tanh"``.

    Probed with a GEMM whose product is exact in any precision (an identity
    weight and inputs that are multiples of 1/8 within ±4), so the only
    difference left is the GELU formula; the result is compared, in float64,
    with both variants. Probed once per device and dtype.
    """
    return _gelu_epilogue_variant(torch.device(device), dtype)


@functools.lru_cache(maxsize=None)
def _gelu_epilogue_variant(dev: torch.device, dtype: torch.dtype) -> str:
    values = torch.arange(-32, 32, dtype=torch.float64) / 8                    # (64,) exact in bf16
    x = torch.diag(values).to(dtype=dtype, device=dev)                         # (64, 64)
    eye = torch.eye(64, dtype=dtype, device=dev)
    bias = torch.zeros(64, dtype=dtype, device=dev)
    y = torch._addmm_activation(bias, x, eye, use_gelu=True).diagonal().double().cpu()
    err_exact = (y - torch.nn.functional.gelu(values)).abs().sum()
    err_tanh = (y - torch.nn.functional.gelu(values, approximate="tanh")).abs().sum()
    return "gelu_tanh" if err_tanh < err_exact else "gelu"


def _device_present(device: torch.device) -> bool:
    return device.type != "cuda" or torch.cuda.is_available()


@selection
def select_linear_act(device: torch.device | str, dtype: torch.dtype, act: str, in_features: int = 2,
                      out_features: int = 2, separate: bool = False) -> Choice:
    """The one decision of how ``act(x @ Wᵀ + b)`` runs on ``device`` in ``dtype``.

    ``Choice.impl``: ``cublaslt_relu`` / ``cublaslt_gelu`` (one ``_addmm_activation``
    call), ``separate`` (``F.linear``, then the activation in place) or
    ``cublaslt_on_device`` (a CUDA device that is not here: whether its GELU
    epilogue is the model's GELU is probed on the device itself).
    """
    check(act, LINEAR_ACTIVATIONS)
    device = torch.device(device)
    lt = (not separate and device.type == "cuda" and dtype in _LT_DTYPES and not _LT_DISABLED
          and in_features > 1 and out_features > 1)               # PyTorch skips cuBLASLt for 1-wide weights
    if lt and act == "relu":
        return Choice("cublaslt_relu", WORDS("label.lt_relu"), True)
    if lt and act in ("gelu", "gelu_tanh"):
        if not _device_present(device):
            return Choice("cublaslt_on_device", WORDS("label.lt_on_device", act=act), True)
        variant = _gelu_epilogue_variant(device, dtype)
        if variant == act:
            return Choice("cublaslt_gelu", WORDS("label.lt_gelu", act="gelu(tanh)" if act == "gelu_tanh" else "gelu"), True)
        return Choice("separate", WORDS("label.variant", act=act, variant=variant), False)
    if act == "none":
        return Choice("separate", WORDS("label.linear"), False)
    return Choice("separate", WORDS("label.separate", act=act), False)


def linear_act(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act: str = "relu",
               separate: bool = False, impl: str | None = None) -> torch.Tensor:
    """``act(x @ weightᵀ + bias)`` as ``select_linear_act`` decides.

    ``x``: ``(..., in)``, ``weight``: ``(out, in)``, ``bias``: ``(out,)`` or None. ``impl``: the ``Choice.impl``
    decided for the call's target (a lowered fused call that stays is handed it); given, the selection is not
    asked, except for ``cublaslt_on_device``: a choice made without the CUDA device, whose GELU epilogue is
    probed on the device itself, a fact only the run has (asked here, by name, once per call).
    """
    if impl is None or impl == "cublaslt_on_device":
        impl = select_linear_act(x.device, x.dtype, act, weight.shape[1], weight.shape[0], separate).impl
    if impl in ("cublaslt_relu", "cublaslt_gelu") and weight.dtype == x.dtype and x.numel() > 0:
        x2 = x.reshape(-1, x.shape[-1])                                       # (rows, in)
        b = bias if bias is not None else torch.zeros(weight.shape[0], dtype=x.dtype, device=x.device)
        y = torch._addmm_activation(b.to(x.dtype).contiguous(), x2, weight.t(),  # (rows, out)
                                    use_gelu=impl == "cublaslt_gelu")
        return y.reshape(*x.shape[:-1], weight.shape[0])
    return apply_activation_(torch.nn.functional.linear(x, weight, bias), act)


def linear_act_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         act: str = "relu") -> torch.Tensor:
    """Unfused: ``F.linear`` then the activation out of place."""
    check(act, LINEAR_ACTIVATIONS)
    return apply_activation(torch.nn.functional.linear(x, weight, bias), act)


# ====================================================================== the fused call

# Each takes, last, the impl its lowering hands it where the call stays in a lean graph (``bind_impl``); None (a graph
# run as it is fused): the selection decides at every call.

def fused_linear_act(x, weight, bias, act, impl=None):
    """``act(x @ weightᵀ + bias)``: cuBLASLt epilogue where it applies."""
    return linear_act(x, weight, bias, act, impl=impl)


# ====================================================================== lowering (lean graphs)

def lower_linear_act(gm: torch.fx.GraphModule, node: torch.fx.Node, device: torch.device, dtype: torch.dtype,
                     separate: bool = False) -> bool:
    """A ``fused_linear_act(x, weight, bias, act)`` call (or the linear family's separate-epilogue twin) → one
    ``torch._addmm_activation`` (cuBLASLt epilogue) or ``linear`` + the activation, as the rewrite chose for this
    device and dtype (``edit.planned``; a call it did not fuse for them, such as the one ConvNeXt's lowering
    makes, asks the selection); a call that stays takes the impl (``bind_impl``)."""
    if len(node.args) != 4:
        return False
    x, weight, bias, act = node.args
    w = edit.attr_tensor(gm, weight)
    x_shape = aten.static_shape(x)
    if w is None or w.dim() != 2 or x_shape is None or act not in LINEAR_ACTIVATIONS:
        return bind_impl(node, 4, edit.planned(node, device, dtype))
    choice = on_device(edit.planned(node, device, dtype) or select_linear_act(device, dtype, act, w.shape[1],
                                                                               w.shape[0], separate),
                        device, dtype, act, w.shape[1], w.shape[0], separate)
    if choice.impl in ("cublaslt_relu", "cublaslt_gelu"):
        b = edit.attr_tensor(gm, bias)
        if b is None or b.dim() != 1 or not b.is_contiguous() or 0 in x_shape:
            return bind_impl(node, 4, choice)  # the generic target handles these (a zero bias, a cast, an empty input)
        name = weight_t_attr(gm, weight, w)

        def build(g: torch.fx.Graph) -> torch.fx.Node:
            x2 = g.call_function(torch.reshape, (x, [-1, x_shape[-1]]))                      # (rows, in)
            wt = g.get_attr(name)                                                           # (in, out) view
            y = g.call_function(torch._addmm_activation, (bias, x2, wt),
                                {"use_gelu": choice.impl == "cublaslt_gelu"})
            return g.call_function(torch.reshape, (y, [*x_shape[:-1], w.shape[0]]))

        return edit.replace_node(gm, node, build)
    if choice.impl != "separate":
        return bind_impl(node, 4, choice)
    return edit.replace_node(gm, node, lambda g: in_place_node(
        g, g.call_function(torch._C._nn.linear, (x, weight, bias)), act))


def on_device(choice: Choice, device: torch.device, dtype: torch.dtype, act: str, in_f: int, out_f: int,
               separate: bool = False) -> Choice:
    """``choice``, or where it is ``cublaslt_on_device`` (made without the CUDA device: whether its GELU epilogue
    is the model's GELU is probed on the device itself, which the rewrite could not do) and the device is here,
    the selection's answer on it: the one call a lowering makes for a chain the rewrite decided, named here."""
    if choice.impl == "cublaslt_on_device" and _device_present(torch.device(device)):
        return select_linear_act(device, dtype, act, in_f, out_f, separate)
    return choice


def bind_impl(node: torch.fx.Node, arity: int, choice: Choice | None) -> bool:
    """A fused call the lowering leaves in the graph takes the recorded impl (``edit.bind_choice``), so that it does
    not ask the selection at every call. A call with no recorded choice keeps asking (returns False), and so does one
    recorded as ``cublaslt_on_device`` and lowered without the device: whether cuBLASLt's GELU is the model's is a
    fact of the device, which only the run has (``linear_act`` asks the selection there, by name)."""
    return choice is not None and choice.impl != "cublaslt_on_device" and edit.bind_choice(node, arity, choice.impl)


def weight_t_attr(gm: torch.fx.GraphModule, weight: torch.fx.Node, w: torch.Tensor) -> str:
    """A root attribute holding ``w.t()`` (a view: no copy), for cuBLASLt's (in, out) operand. Detached: a view of
    a parameter that requires grad would carry a ``TBackward0`` link to it, and a graph holding such a non-leaf
    buffer cannot be deep-copied."""
    name = "_lean_t_" + str(weight.target).replace(".", "_")
    if not hasattr(gm, name):
        gm.register_buffer(name, w.detach().t(), persistent=False)
    return name

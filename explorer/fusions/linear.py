"""The linear family: a linear layer with its bias and activation in the GEMM epilogue.

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

``select_linear_act`` is the one decision: the runtime call, the label and the
lean lowering all ask it.
"""

from __future__ import annotations

import functools
import math
import os

import torch
import torch.fx

from explorer.fusions import edit
from explorer.fusions.base import PAYS_CAVEAT, PRECISION_CAVEAT, Choice, NoMatch, Pattern, Step, selection
from explorer.fusions.base import WORDS as BASE_WORDS
from explorer.fusions.edit import Refuse, RewriteContext, UseGeneric
from explorer.fusions.epilogue import EPILOGUE_TOLERANCES, apply_activation, apply_activation_, check, in_place_node
from explorer.graph import aten
from explorer.vocab import ACTIVATIONS, TRANSPARENT
from explorer.words import Words

#: What this family says to a person, in English and 中文 (rendered by explorer.ui.i18n by id).
WORDS = Words("linear", {
    "title": ("Linear + activation", "线性层 + 激活函数"),
    "linear_act.label": ("Linear+bias+act", "Linear+偏置+激活"),
    "linear_act.implementation": ("cuBLASLt bias+activation epilogue (torch._addmm_activation) for ReLU/GELU",
                                  "ReLU/GELU 用 cuBLASLt 的偏置+激活尾处理（torch._addmm_activation）"),
    "linear_act.explanation": (("The GEMM's epilogue adds the bias and applies the activation while the output "
                                "tile is still in registers: the pre-activation tensor (4x hidden wide in a "
                                "transformer MLP) is never written out."),
                               "GEMM 的尾处理在输出分块还在寄存器里时加偏置、做激活：激活前的张量（Transformer MLP 中是隐藏维度的 4 倍宽）从不写出。"),
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
    "generic.not_plain": ("{op} is not a plain linear", "{op} 不是普通的线性层"),
    "generic.no_epilogue": ("activation {act} has no linear epilogue", "激活函数 {act} 没有线性层尾处理"),
    "generic.addmm": ("an addmm with beta or alpha != 1, or a bias that is not one row", "addmm 的 beta 或 alpha 不等于 1，或偏置不是一行"),
    "generic.bias_shape": ("the add after x @ W.T is not a bias of the output width (shape {shape})",
                           "x @ W.T 之后的加法不是与输出宽度相同的偏置（形状 {shape}）"),
    "forms.label": ("Linear+bias+act (as written)", "Linear+偏置+激活（按模型的写法）"),
    "forms.implementation": (("the same GEMM epilogue as Linear+bias+act, for a linear written as addmm or x @ W.T + b, "
                              "a reshape before the activation, or a GELU written out (GPT-2's tanh GELU, CLIP's "
                              "quick GELU)"),
                             "与 Linear+偏置+激活 相同的 GEMM 尾处理，适用于写成 addmm 或 x @ W.T + b 的线性层、激活前的 reshape，"
                             "或逐项写出的 GELU（GPT-2 的 tanh GELU、CLIP 的 quick GELU）"),
    "forms.explanation": (("Models write the same linear layer and activation in other words: GPT-2's Conv1D is an "
                           "addmm, Falcon multiplies by W.T and adds the bias, GPT-2 spells its tanh GELU out in 8 "
                           "elementwise ops and CLIP its quick GELU x·sigmoid(1.702x) in 3. Read as what they are, "
                           "they are one GEMM with its epilogue: the pre-activation tensor and every intermediate of "
                           "the formula stay unwritten."),
                          ("模型会用别的写法表达同样的线性层和激活：GPT-2 的 Conv1D 是 addmm，Falcon 乘以 W.T 再加偏置，GPT-2 用 8 个逐元素算子写出 "
                           "tanh GELU，CLIP 用 3 个算子写出 quick GELU x·sigmoid(1.702x)。按其本义读出来，它们就是一个带尾处理的 GEMM：激活前的张量"
                           "和公式里的每个中间结果都不必写出。")),
})


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


# ====================================================================== fused call targets

# Each takes, last, the impl its lowering hands it where the call stays in a lean graph (``_bind``); None (a graph
# run as it is fused): the selection decides at every call.

def fused_linear_act(x, weight, bias, act, impl=None):
    """``act(x @ weightᵀ + bias)``: cuBLASLt epilogue where it applies."""
    return linear_act(x, weight, bias, act, impl=impl)


def fused_linear_separate_epilogue(x, weight, bias, act, impl=None):
    """Kernel choice "separate_epilogue": the linear with its bias, then ``act`` in place."""
    return linear_act(x, weight, bias, act, separate=True, impl=impl)


# ====================================================================== rewrite

def rewrite(ctx: RewriteContext, chain, kernel: str) -> edit.Edit:
    """linear → act as one cuBLASLt epilogue call where it applies; the kernel choice
    "separate_epilogue" runs the linear, then the activation in place."""
    compute = set(chain.compute_nodes)
    if aten.aten_name(ctx.node(chain, "linear")) != "linear" or any(
            aten.aten_name(ctx.by_name[n]) in _ROW_VIEWS for n in chain.nodes if n not in compute):
        return rewrite_forms(ctx, chain, kernel)   # addmm, or a reshape before the activation
    edit.only_identity_views(ctx, chain)
    lin_node = ctx.node(chain, "linear")
    lin = aten.linear_args(lin_node)
    if lin is None:
        raise UseGeneric(WORDS("generic.not_plain", op=aten.aten_name(lin_node)))
    act = aten.activation_name(ctx.node(chain, "act"))
    if act not in LINEAR_ACTIVATIONS:
        raise UseGeneric(WORDS("generic.no_epilogue", act=act))
    separate = kernel == "separate_epilogue"
    w = aten.static_shape(lin.weight) or (2, 2)
    choice = select_linear_act(ctx.device, ctx.run_dtype(lin_node), act, w[-1], w[0], separate)
    target = fused_linear_separate_epilogue if separate else fused_linear_act
    return edit.whole_chain_edit(ctx, chain, target, (lin.input, lin.weight, lin.bias, act),
                                 edit.epilogue_choice(ctx, choice, separate, BASE_WORDS("gemm_epilogue")))


# ====================================================================== lowering (lean graphs)

def _lower(gm: torch.fx.GraphModule, node: torch.fx.Node, device: torch.device, dtype: torch.dtype,
           separate: bool) -> bool:
    """fused_linear_act → one ``torch._addmm_activation`` (cuBLASLt epilogue) or ``linear`` + the activation, as
    the rewrite chose for this device and dtype (``edit.planned``; a call it did not fuse for them, such as
    the one ConvNeXt's lowering makes, asks the selection)."""
    if len(node.args) != 4:
        return False
    x, weight, bias, act = node.args
    w = edit.attr_tensor(gm, weight)
    x_shape = aten.static_shape(x)
    if w is None or w.dim() != 2 or x_shape is None or act not in LINEAR_ACTIVATIONS:
        return _bind(node, 4, edit.planned(node, device, dtype))
    choice = _on_device(edit.planned(node, device, dtype) or select_linear_act(device, dtype, act, w.shape[1],
                                                                               w.shape[0], separate),
                        device, dtype, act, w.shape[1], w.shape[0], separate)
    if choice.impl in ("cublaslt_relu", "cublaslt_gelu"):
        b = edit.attr_tensor(gm, bias)
        if b is None or b.dim() != 1 or not b.is_contiguous() or 0 in x_shape:
            return _bind(node, 4, choice)  # the generic target handles these (a zero bias, a cast, an empty input)
        name = _weight_t(gm, weight, w)

        def build(g: torch.fx.Graph) -> torch.fx.Node:
            x2 = g.call_function(torch.reshape, (x, [-1, x_shape[-1]]))                      # (rows, in)
            wt = g.get_attr(name)                                                           # (in, out) view
            y = g.call_function(torch._addmm_activation, (bias, x2, wt),
                                {"use_gelu": choice.impl == "cublaslt_gelu"})
            return g.call_function(torch.reshape, (y, [*x_shape[:-1], w.shape[0]]))

        return edit.replace_node(gm, node, build)
    if choice.impl != "separate":
        return _bind(node, 4, choice)
    return edit.replace_node(gm, node, lambda g: in_place_node(
        g, g.call_function(torch._C._nn.linear, (x, weight, bias)), act))


def _on_device(choice: Choice, device: torch.device, dtype: torch.dtype, act: str, in_f: int, out_f: int,
               separate: bool = False) -> Choice:
    """``choice``, or where it is ``cublaslt_on_device`` (made without the CUDA device: whether its GELU epilogue
    is the model's GELU is probed on the device itself, which the rewrite could not do) and the device is here,
    the selection's answer on it: the one call a lowering makes for a chain the rewrite decided, named here."""
    if choice.impl == "cublaslt_on_device" and _device_present(torch.device(device)):
        return select_linear_act(device, dtype, act, in_f, out_f, separate)
    return choice


def _bind(node: torch.fx.Node, arity: int, choice: Choice | None) -> bool:
    """A fused call the lowering leaves in the graph takes the recorded impl (``edit.bind_choice``), so that it does
    not ask the selection at every call. A call with no recorded choice keeps asking (returns False), and so does one
    recorded as ``cublaslt_on_device`` and lowered without the device: whether cuBLASLt's GELU is the model's is a
    fact of the device, which only the run has (``linear_act`` asks the selection there, by name)."""
    return choice is not None and choice.impl != "cublaslt_on_device" and edit.bind_choice(node, arity, choice.impl)


def _weight_t(gm: torch.fx.GraphModule, weight: torch.fx.Node, w: torch.Tensor) -> str:
    """A root attribute holding ``w.t()`` (a view: no copy), for cuBLASLt's (in, out) operand."""
    name = "_lean_t_" + str(weight.target).replace(".", "_")
    if not hasattr(gm, name):
        gm.register_buffer(name, w.t(), persistent=False)
    return name


LOWERINGS = {
    fused_linear_act: lambda gm, node, device, dtype: _lower(gm, node, device, dtype, separate=False),
    fused_linear_separate_epilogue: lambda gm, node, device, dtype: _lower(gm, node, device, dtype, separate=True),
}


# ====================================================================== the forms real models write

def fused_linear_act_forms(x, weight, bias, act, weight_t, shape, impl=None):
    """``act(x @ Wᵀ + b)`` where the model wrote the linear as ``addmm`` (GPT-2's Conv1D keeps ``Wᵀ``, so
    ``weight_t``), as ``x @ W.T + b`` (Falcon) or with a reshape before the activation; ``shape`` is the
    activation's output shape (None: the linear's own); ``impl``: as ``fused_linear_act``'s."""
    y = linear_act(x, weight.t() if weight_t else weight, bias, act, impl=impl)
    return y if shape is None else y.reshape(tuple(shape))


def _lower_forms(gm: torch.fx.GraphModule, node: torch.fx.Node, device: torch.device, dtype: torch.dtype) -> bool:
    """fused_linear_act_forms → the calls ``linear_act`` makes for it on this device and dtype, then the reshape
    to ``shape``: one ``_addmm_activation`` on ``Wᵀ`` (a GPT-2 Conv1D weight as it is stored; another's transpose
    as a view), or ``linear`` + the activation in place. The same library calls on the same operands as the
    generic target, without its per-call selection (GPT-2's four per forward: 158 µs each on the H200 host,
    ``benchmarks/results/profile_host_h200.json``)."""
    if node.kwargs or len(node.args) != 6:
        return False
    x, weight, bias, act, weight_t, shape = node.args
    w = edit.attr_tensor(gm, weight)
    x_shape = aten.static_shape(x)
    if (w is None or w.dim() != 2 or x_shape is None or act not in LINEAR_ACTIVATIONS or not isinstance(weight_t, bool)
            or 0 in x_shape):
        return _bind(node, 6, edit.planned(node, device, dtype))
    in_f, out_f = (w.shape[0], w.shape[1]) if weight_t else (w.shape[1], w.shape[0])
    out_shape = list(shape) if shape is not None else [*x_shape[:-1], out_f]
    choice = _on_device(edit.planned(node, device, dtype) or select_linear_act(device, dtype, act, in_f, out_f),
                        device, dtype, act, in_f, out_f)
    if choice.impl in ("cublaslt_relu", "cublaslt_gelu"):
        b = edit.attr_tensor(gm, bias)
        if b is None or b.dim() != 1 or not b.is_contiguous() or b.dtype != w.dtype:
            return _bind(node, 6, choice)  # the generic target handles these (a zero bias, a cast)

        def build(g: torch.fx.Graph) -> torch.fx.Node:
            x2 = g.call_function(torch.reshape, (x, [-1, in_f]))                              # (rows, in)
            wt = weight if weight_t else g.get_attr(_weight_t(gm, weight, w))                 # (in, out)
            y = g.call_function(torch._addmm_activation, (bias, x2, wt),
                                {"use_gelu": choice.impl == "cublaslt_gelu"})
            return g.call_function(torch.reshape, (y, out_shape))

        return edit.replace_node(gm, node, build)
    if choice.impl != "separate":
        return _bind(node, 6, choice)   # cublaslt_on_device lowered without the device: the call probes it

    def build_separate(g: torch.fx.Graph) -> torch.fx.Node:
        w_out_in = g.get_attr(_weight_t(gm, weight, w)) if weight_t else weight                # (out, in)
        y = in_place_node(g, g.call_function(torch._C._nn.linear, (x, w_out_in, bias)), act)
        return y if shape is None else g.call_function(torch.reshape, (y, out_shape))

    return edit.replace_node(gm, node, build_separate)


LOWERINGS[fused_linear_act_forms] = _lower_forms


def _linear_operands(ctx: RewriteContext, chain) -> tuple:
    """``(x, weight, weight_t, bias)`` of the chain's linear, however it is written; ``UseGeneric`` otherwise."""
    node = ctx.node(chain, "linear")
    name = aten.aten_name(node)
    if name == "linear":
        lin = aten.linear_args(node)
        return lin.input, lin.weight, False, lin.bias
    if name == "addmm":
        a = aten.args_of(node)
        if a.get("beta", 1) != 1 or a.get("alpha", 1) != 1 or aten.static_shape(a["self"]) is None \
                or len(aten.static_shape(a["self"])) != 1:
            raise UseGeneric(WORDS("generic.addmm"))
        w = aten.transposed_weight(a["mat2"])
        return (a["mat1"], w, False, a["self"]) if w is not None else (a["mat1"], a["mat2"], True, a["self"])
    w = aten.transposed_weight(node.args[1]) if name == "matmul" and len(node.args) > 1 else None
    if w is None:
        raise UseGeneric(WORDS("generic.not_plain", op=name))
    bias = None
    bias_node = ctx.node(chain, "bias")
    if bias_node is not None:
        edit.check_alpha(bias_node)
        bias = edit.other_operand(bias_node, set(ctx.members(chain)))
        shape = aten.static_shape(bias)
        if bias.op != "get_attr" or shape is None or len(shape) != 1 or shape[0] != aten.static_shape(w)[0]:
            raise UseGeneric(WORDS("generic.bias_shape", shape=list(shape or ())))
    return node.args[0], w, False, bias


def _act_of(ctx: RewriteContext, chain) -> str:
    """The activation the chain applies: its one op's, a written-out GELU's, or none (a linear and its bias)."""
    roles = {r for _, r in chain.roles}
    if "gelu_tanh" in roles:
        return "gelu_tanh"
    if "qgelu_sigmoid" in roles:
        return "quick_gelu"
    node = ctx.node(chain, "act")
    return "none" if node is None else aten.activation_name(node)


def rewrite_forms(ctx: RewriteContext, chain, kernel: str) -> edit.Edit:
    """A linear written as ``addmm`` or ``x @ W.T (+ b)``, reshaped before its activation, or followed by a
    written-out GELU: one ``linear_act`` call (the cuBLASLt epilogue where it applies), reshaped as the model."""
    compute = set(chain.compute_nodes)
    for name in chain.nodes:
        if name in compute:
            continue
        node = ctx.by_name[name]
        aname = aten.aten_name(node)
        if (aname.startswith("dropout") or aname == "feature_dropout") and aten.is_training_dropout(node):
            raise Refuse(BASE_WORDS("training_dropout"))
        if aname not in _ROW_VIEWS and not aname.startswith("dropout") and aname not in ("alias", "detach"):
            raise UseGeneric(BASE_WORDS("op_inside", op=aname))
    x, weight, weight_t, bias = _linear_operands(ctx, chain)
    act = _act_of(ctx, chain)
    if act not in LINEAR_ACTIVATIONS:
        raise UseGeneric(WORDS("generic.no_epilogue", act=act))
    lin_node = ctx.node(chain, "linear")
    last = ctx.by_name[chain.roles[-1][0]]
    out_shape, lin_shape = aten.static_shape(last), aten.static_shape(lin_node)
    shape = list(out_shape) if out_shape is not None and out_shape != lin_shape else None
    w = aten.static_shape(weight) or (2, 2)
    if weight_t:
        w = tuple(reversed(w))
    choice = select_linear_act(ctx.device, ctx.run_dtype(lin_node), act, w[-1], w[0], kernel == "separate_epilogue")
    label = choice.label if choice.fused else edit.not_fused_note(ctx.device, choice.label, BASE_WORDS("gemm_epilogue"))
    return edit.whole_chain_edit(ctx, chain, fused_linear_act_forms, (x, weight, bias, act, weight_t, shape),
                                 Choice(choice.impl, label, choice.fused))


_ROW_VIEWS = frozenset({"view", "_unsafe_view", "reshape", "flatten", "unflatten", "unsqueeze", "squeeze"})


def _close(value, want: float) -> bool:
    return isinstance(value, (int, float)) and abs(float(value) - want) <= 1e-4 * abs(want)


def _only(g, node: str) -> str | None:
    succ = list(g.successors(node))
    return succ[0] if len(succ) == 1 else None


def _through_views(g, node: str) -> tuple[list[str], str, list[str]]:
    """From ``node`` along single-consumer views: (the views, the last node, its consumers in order)."""
    path = []
    while True:
        succ = sorted(g.successors(node), key=lambda n: g.nodes[n]["order"])
        if len(succ) == 1 and g.nodes[succ[0]]["kind"] in TRANSPARENT:
            node = succ[0]
            path.append(node)
            continue
        return path, node, succ


def written_activation(g, y: str, users: list[str]) -> list[tuple[str, str]] | None:
    """The nodes of a GELU written out from ``y`` as ``(node, role)`` (the last one's role ``act``), or None.

    GPT-2's ``0.5·y·(1 + tanh(√(2/π)·(y + 0.044715·y³)))`` (8 ops) and CLIP's ``y·sigmoid(1.702·y)`` (3 ops),
    as torch.export writes them; every inner value must have no reader outside the formula."""
    kinds = {}
    for u in users:
        kinds.setdefault(g.nodes[u]["kind"], []).append(u)
    attr = g.nodes
    if sorted(kinds) == ["add", "mul", "pow"] and all(len(v) == 1 for v in kinds.values()):
        ma, p, ac = kinds["mul"][0], kinds["pow"][0], kinds["add"][0]
        mb = _only(g, p)
        if not (_close(attr[ma].get("scalar"), 0.5) and _close(attr[p].get("exponent"), 3.0) and mb
                and attr[mb]["kind"] == "mul" and _close(attr[mb].get("scalar"), 0.044715) and _only(g, mb) == ac):
            return None
        md = _only(g, ac)
        t = _only(g, md) if md else None
        ae = _only(g, t) if t else None
        mf = _only(g, ae) if ae else None
        if not (md and attr[md]["kind"] == "mul" and _close(attr[md].get("scalar"), math.sqrt(2 / math.pi))
                and t and attr[t]["kind"] == "tanh" and ae and attr[ae]["kind"] == "add"
                and _close(attr[ae].get("scalar"), 1.0) and mf and attr[mf]["kind"] == "mul"
                and _only(g, ma) == mf and set(g.predecessors(mf)) == {ma, ae}):
            return None
        return [(ma, "gelu_half"), (p, "gelu_cube"), (mb, "gelu_coef"), (ac, "gelu_inner"), (md, "gelu_scale"),
                (t, "gelu_tanh"), (ae, "gelu_one"), (mf, "act")]
    if list(kinds) == ["mul"] and len(users) == 4:
        return _bloom_gelu(g, y, users)
    if list(kinds) == ["mul"] and len(users) == 2:
        scaled = [u for u in users if _close(attr[u].get("scalar"), 1.702)]
        if len(scaled) != 1:
            return None
        ma = scaled[0]
        mc = next(u for u in users if u != ma)
        s = _only(g, ma)
        if not (s and attr[s]["kind"] == "sigmoid" and _only(g, s) == mc and set(g.predecessors(mc)) == {y, s}):
            return None
        return [(ma, "qgelu_scale"), (s, "qgelu_sigmoid"), (mc, "act")]
    return None


def _bloom_gelu(g, y: str, users: list[str]) -> list[tuple[str, str]] | None:
    """BLOOM's spelling of the tanh GELU, ``y·0.5·(1 + tanh(0.79788456·y·(1 + 0.044715·y·y)))`` (9 ops, ``y·y``
    instead of ``pow``; ``bloom_gelu_forward``): the same function as GPT-2's, its constant √(2/π) to 8 digits."""
    attr = g.nodes
    by_scalar = {}
    for u in users:
        for name, want in (("half", 0.5), ("scale", math.sqrt(2 / math.pi)), ("coef", 0.044715)):
            if _close(attr[u].get("scalar"), want):
                by_scalar[name] = u
    square = [u for u in users if u not in by_scalar.values()]
    if len(by_scalar) != 3 or len(square) != 1:
        return None
    ma, md, mb, mq = by_scalar["half"], by_scalar["scale"], by_scalar["coef"], square[0]
    if not (_only(g, mb) == mq and set(g.predecessors(mq)) == {mb, y}):       # 0.044715·y·y
        return None
    ac = _only(g, mq)
    if not (ac and attr[ac]["kind"] == "add" and _close(attr[ac].get("scalar"), 1.0)):   # 1 + 0.044715·y²
        return None
    mi = _only(g, ac)
    if not (mi and attr[mi]["kind"] == "mul" and _only(g, md) == mi and set(g.predecessors(mi)) == {md, ac}):
        return None
    t = _only(g, mi)
    ae = _only(g, t) if t and attr[t]["kind"] == "tanh" else None
    mf = _only(g, ae) if ae and attr[ae]["kind"] == "add" and _close(attr[ae].get("scalar"), 1.0) else None
    if not (mf and attr[mf]["kind"] == "mul" and _only(g, ma) == mf and set(g.predecessors(mf)) == {ma, ae}):
        return None
    return [(ma, "gelu_half"), (md, "gelu_scale"), (mb, "gelu_coef"), (mq, "gelu_cube"), (ac, "gelu_inner"),
            (mi, "gelu_inner_scale"), (t, "gelu_tanh"), (ae, "gelu_one"), (mf, "act")]


_SINGLE_ACTS = frozenset({"relu", "gelu", "silu", "tanh", "hardswish"})


def _match_forms(g, pattern: Pattern, anchor: str, claimed: dict) -> list:
    """A linear (or ``x @ W.T`` of a constant ``W``), an optional constant bias add, then a written-out GELU or,
    for ``x @ W.T``, one activation; ``x @ W.T + b`` alone is a linear with its bias."""
    attrs = g.nodes[anchor]
    if attrs["kind"] == "matmul" and not attrs.get("weight_t"):
        raise NoMatch(None, [anchor])
    matched = [(anchor, "linear", True)]
    path, y, users = _through_views(g, anchor)
    matched += [(p, "view", False) for p in path]
    if attrs["kind"] == "matmul" and len(users) == 1 and g.nodes[users[0]]["kind"] == "add" \
            and g.nodes[users[0]].get("const_operand") and not g.nodes[users[0]].get("scalar_operand"):
        matched.append((users[0], "bias", True))
        path, y, users = _through_views(g, users[0])
        matched += [(p, "view", False) for p in path]
    act = written_activation(g, y, users)
    if act is None and attrs["kind"] == "matmul" and len(users) == 1 and g.nodes[users[0]]["kind"] in _SINGLE_ACTS:
        act = [(users[0], "act")]
    if act is None:
        if len(matched) > 1 and matched[-1][1] == "bias" or any(r == "bias" for _, r, _ in matched):
            while matched[-1][1] == "view":
                matched.pop()          # the views after the bias are not the chain's
            act = []
        else:
            raise NoMatch(None, [n for n, _, _ in matched])
    matched += [(n, r, True) for n, r in act]
    if any(n in claimed for n, _, _ in matched):
        raise NoMatch(None, [n for n, _, _ in matched])
    return matched


# ====================================================================== patterns

#: Which families this one must claim nodes before or after (explorer.fusions.order).
RUNS_BEFORE = ("rms_norm", "norm", "siblings")

PATTERNS = (
    Pattern(
        name="linear_act", label=WORDS("linear_act.label"), stage="activation",
        steps=(Step(frozenset({"linear"}), "linear"),
               Step(frozenset(LINEAR_ACTIVATIONS) - {"none", "gelu_tanh"}, "act", family=ACTIVATIONS)),
        color="#9467bd", kernels=("auto", "separate_epilogue", "inductor"), rewrite=rewrite,
        implementation=WORDS("linear_act.implementation"),
        explanation=WORDS("linear_act.explanation"),
        caveats=(PRECISION_CAVEAT, PAYS_CAVEAT),
    ),
    Pattern(
        name="linear_act_forms", label=WORDS("forms.label"), stage="activation",
        steps=(Step(frozenset({"linear", "matmul"}), "linear"), Step(frozenset({"add"}), "bias", optional=True),
               Step(frozenset(ACTIVATIONS | {"mul"}), "act", optional=True)),
        match=_match_forms, color="#c5b0d5", kernels=("auto", "separate_epilogue", "inductor"), rewrite=rewrite_forms,
        implementation=WORDS("forms.implementation"),
        explanation=WORDS("forms.explanation"),
        caveats=(PRECISION_CAVEAT, PAYS_CAVEAT),
    ),
)

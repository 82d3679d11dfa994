"""The generic fusion: a chain's ops compiled together by inductor, and the elementwise-chain pattern.

::

    x ─► mul ─► add ─► tanh ─► y         x ─► fused_subgraph(chain module) ─► y
         (3 kernels, 2 intermediates)         (inductor: 1 kernel, intermediates in registers)

Every pattern can take this path: a pattern without a kernel of its own
(``elementwise_chain``), a chain whose shape a specialised kernel does not
take (its rewrite raises ``UseGeneric``), and any chain whose plan chooses the
kernel "inductor". The chain's nodes become a small GraphModule
(``edit.extract_subgraph``) called through ``fused_subgraph``; it is compiled
at its first call.
"""

from __future__ import annotations

import collections
import copy
import functools
import logging
import os
import shutil
from typing import Callable

import torch
import torch.fx

from explorer.fusions import edit
from explorer.fusions.base import PAYS_CAVEAT, Choice, Pattern, Step
from explorer.fusions.edit import NewAttr, RewriteContext
from explorer.vocab import ELEMENTWISE
from explorer.words import Words

#: What this family says to a person, in English and 中文 (rendered by explorer.ui.i18n by id).
WORDS = Words("generic", {
    "title": ("Elementwise chain", "逐元素算子链"),
    "elementwise_chain.label": ("Elementwise chain", "逐元素算子链"),
    "elementwise_chain.implementation": (("the chain's subgraph compiled on its own by torch.compile's inductor "
                                          "(generic fallback)"),
                                         "链的子图单独交给 torch.compile 的 inductor 编译（通用兜底方案）"),
    "elementwise_chain.explanation": (("Consecutive pointwise ops are memory-bound: each reads and writes the "
                                       "whole tensor. One kernel reads the inputs once and writes the result once."),
                                      "连续的逐元素算子都受访存限制：每个都要读写整个张量。一个内核把输入只读一次、把结果只写一次。"),
    "label": ("generic: torch.compile's inductor on the chain subgraph", "通用方案：用 torch.compile 的 inductor 编译链的子图"),
    "label.why": ("generic: torch.compile's inductor on the chain subgraph ({why})",
                  "通用方案：用 torch.compile 的 inductor 编译链的子图（{why}）"),
    "choice_inductor": ("kernel choice: inductor", "内核选择：inductor"),
    "note.off": (("{label}; torch.compile off (EXPLORER_GENERIC_COMPILE=0): the ops run eagerly, one kernel each "
                  "(not fused)"),
                 "{label}；torch.compile 已关闭（EXPLORER_GENERIC_COMPILE=0）：算子以 eager 方式运行，每个一个内核（未融合）"),
    "note.no_compiler": ("{label}; no C++ compiler on cpu: the ops run eagerly, one kernel each (not fused)",
                         "{label}；cpu 上没有 C++ 编译器：算子以 eager 方式运行，每个一个内核（未融合）"),
    "note.cpp": ("{label} [cpu: inductor C++ kernel]", "{label} [cpu：inductor C++ 内核]"),
})


log = logging.getLogger(__name__)

GENERIC_LABEL = WORDS("label")
#: Compiled versions kept per chain (one per input signature); the oldest goes beyond this.
MAX_SIGNATURES = 16


def fused_subgraph(chain_module, *inputs):
    """Run a chain's own small GraphModule (``CompiledChain``: compiled by inductor at its first call)."""
    return chain_module(*inputs)


def _input_signature(inputs: tuple) -> tuple:
    """What a compiled chain is specialised on: each tensor's shape, strides, dtype and device."""
    return tuple((t.shape, t.stride(), t.dtype, t.device) if isinstance(t, torch.Tensor) else (type(t), t)
                 for t in inputs)


class CompiledChain(torch.nn.Module):
    """A chain's subgraph, compiled by inductor (torch.compile's compiler) at its first call.

    The subgraph is already a graph of ATen ops, so it goes to inductor
    (``torch._inductor.compile_fx.compile_fx``) directly, without dynamo. Dynamo
    would trace it again and check its guards before every call, several times
    the host cost of the ops it replaces
    (``benchmarks/results/graph_host_before_fastpath_h200.json``). Its one guard
    that matters here is kept, cheaper: each compiled version is specialised on
    its inputs' shapes, strides, dtypes and devices (``_input_signature``), and a
    call with another signature compiles another.

    When compiling is impossible (CPU without a C++ compiler) or fails, the
    subgraph runs eagerly, op by op; ``mode`` says which ("pending",
    "compiled", "eager").
    """

    def __init__(self, sub: torch.fx.GraphModule, compile_it: bool) -> None:
        super().__init__()
        self.sub = sub
        self.mode = "pending" if compile_it else "eager"
        self._compiled: collections.OrderedDict[tuple, Callable] = collections.OrderedDict()

    def forward(self, *inputs):
        if self.mode == "eager":
            return self.sub(*inputs)
        key = _input_signature(inputs)
        fn = self._compiled.get(key)
        if fn is None:
            try:
                from torch._inductor.compile_fx import compile_fx  # inductor loads only when a chain compiles

                # compile_fx rewrites the graph it is given (its outputs become a list): a copy
                fn = compile_fx(copy.deepcopy(self.sub), list(inputs))
                out = fn(*inputs)
            except Exception as exc:  # inductor raises many kinds; the eager path is exact
                log.warning("inductor could not compile a fused chain, running it eagerly: %s",
                            str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
                self.mode = "eager"
                return self.sub(*inputs)
            self._compiled[key] = fn
            if len(self._compiled) > MAX_SIGNATURES:
                self._compiled.popitem(last=False)
            self.mode = "compiled"
            return out
        return fn(*inputs)

    def __deepcopy__(self, memo):
        return CompiledChain(copy.deepcopy(self.sub, memo), self.mode != "eager")

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_compiled"] = collections.OrderedDict()
        if state.get("mode") == "compiled":
            state["mode"] = "pending"
        return state


def compile_available(device: torch.device) -> tuple[bool, str]:
    """(compile the generic chains?, the label's note: a message id of ``WORDS`` or ""). ``EXPLORER_GENERIC_COMPILE=0``
    turns compiling off."""
    if os.environ.get("EXPLORER_GENERIC_COMPILE", "1").strip().lower() in ("0", "false", "no", "off"):
        return False, "note.off"
    if device.type == "cuda":
        return True, ""
    if _cpp_compiler() is None:
        return False, "note.no_compiler"
    return True, "note.cpp"


@functools.lru_cache(maxsize=1)
def _cpp_compiler() -> str | None:
    for name in ("g++", "c++", "clang++"):
        path = shutil.which(name)
        if path:
            return path
    return None


def rewrite(ctx: RewriteContext, chain, kernel: str = "auto", why: str = "") -> edit.Edit:
    """The chain's nodes as a small GraphModule, compiled by inductor at its first call."""
    members = [ctx.by_name[n] for n in edit.in_graph_order(ctx.gm, chain.nodes)]
    outputs = [ctx.by_name[n] for n in chain.outputs]
    sub, inputs = edit.extract_subgraph(ctx.gm, members, outputs, attrs_as_placeholders=True)
    compiles, note = compile_available(ctx.device)
    label = WORDS("label.why", why=why) if why else GENERIC_LABEL
    label = WORDS(note, label=label) if note else label
    key = f"chain_{chain.roles[0][0]}"
    edit.check_no_outside_users(members, outputs)
    return edit.Edit(chain, tuple(members), tuple(outputs), fused_subgraph, (NewAttr(key), *inputs),
                     Choice("inductor" if compiles else "eager", label, compiles),
                     modules={key: CompiledChain(sub, compiles)}, tuple_result=len(outputs) > 1)


_POINTWISE = frozenset(ELEMENTWISE - {"where"})

#: Which families this one must claim nodes before or after (explorer.fusions.order).
RUNS_AFTER = ("*",)   # the fallback: pointwise ops no other family claimed

PATTERNS = (
    Pattern(
        name="elementwise_chain", label=WORDS("elementwise_chain.label"),
        steps=(Step(_POINTWISE, "op"), Step(_POINTWISE, "op"), Step(_POINTWISE, "op", optional=True),
               Step(_POINTWISE, "op", optional=True), Step(_POINTWISE, "op", optional=True)),
        color="#e377c2", rewrite=rewrite,
        implementation=WORDS("elementwise_chain.implementation"),
        explanation=WORDS("elementwise_chain.explanation"),
        caveats=(PAYS_CAVEAT,),
    ),
)

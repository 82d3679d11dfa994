"""A lean pass: multi-head attention written sequence-first, run batch-first (no copy of Q, K, V or the output).

``nn.MultiheadAttention(batch_first=True)`` (torchvision's ViT, every model built on it) transposes its input to
sequence-first, ``(L, B, E)``, and ``F.multi_head_attention_forward`` then splits the packed in-projection into
heads for SDPA and gathers the heads back for the out-projection. As captured, per attention::

    x (B, L, E) ─ transpose ─ linear(W_in, b_in) ─ unflatten ─ unsqueeze ─ transpose ─ squeeze ─ contiguous ─┐
                  (a copy inside the linear: ATen's linear on a non-contiguous input is matmul, which            │
                   copies its rows into order, then add_ of the bias)                                            │
    ┌─── select ×3 ─ view (L, B·H, D) ─ transpose ─ view (B, H, L, D) ◀── the whole Q, K, V copied ─────────────┘
    └─▶ SDPA ─ permute (L, B, H, D) ─ reshape (L·B, E) [a copy] ─ linear(W_out, b_out) ─ view ─ transpose ─▶ (B, L, E)

Three copies of activations a layer (ViT-L/16 at batch 32 in fp16 on the H200: 72 ``direct_copy_kernel`` calls,
1.94 ms of its 11.35 ms of GPU work, ``bench_corpus_h200_part15``) and 18 host calls around two GEMMs and SDPA.
Each is a row permutation (``(l, b)`` rows against ``(b, l)`` rows) that a GEMM does not care about:

    ``seq_first_qkv``:  the in-projection on ``x``'s own rows (``(B·L, 3E)``, no copy), Q, K and V as views of it
                        (``(B, L, 3, H, D)`` → select → permute to ``(B, H, L, D)``: the head dim contiguous, as
                        SDPA wants it);
    ``batch_first_out``: the heads gathered as ``(B, L, H, D)`` (for the flash and cuDNN kernels, whose output is
                        laid out so, a view), the out-projection, viewed ``(B, L, E)``.

Exact: each output row is computed by the same ATen ops as before from the same row (``linear`` on a
non-contiguous input is ``matmul`` then ``add_``, and stays so; on a contiguous one it is ``addmm`` and stays so:
``seq_first_qkv`` asks which at every call, as ATen does), so the values are the ones the graph computed, in
other strides. Tested bit for bit on the CPU against the graph without the pass (``tests/test_lean_heads.py``, on
torchvision's ViT and a bare ``nn.MultiheadAttention`` at odd sizes); on the GPU the same GEMM shape runs the
same cuBLAS kernel, but whether a kernel's result for a row is independent of where the row sits is cuBLAS's
business: ``benchmarks/bench_heads.py`` compares the outputs with the pass and without on the GPU (bit for bit,
and the largest difference), and each against float64.

``prepare_graph`` applies it to every graph it times (``lean.Binds.heads``), unfused and fused alike.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx


def op_name(node: Any) -> str:
    """The op a node calls, by its plain name (``transpose``, ``view``...), for every form a captured or lowered
    graph writes it in (an ATen overload, a public function, a tensor method)."""
    if not isinstance(node, torch.fx.Node) or node.op not in ("call_function", "call_method"):
        return ""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name.split("::")[-1]
    return target if isinstance(target, str) else getattr(target, "__name__", "")


def _arg(node: torch.fx.Node, i: int, key: str, default: Any = None) -> Any:
    return node.args[i] if len(node.args) > i else node.kwargs.get(key, default)


def _only_user(node: torch.fx.Node, user: torch.fx.Node) -> bool:
    return list(node.users) == [user]


def _ints(value: Any) -> tuple | None:
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
        return tuple(value)
    return None


def _shape_arg(node: torch.fx.Node) -> tuple | None:
    """The sizes a ``view``/``reshape`` node asks for, as one list or as separate ints."""
    return _ints(node.args[1]) if len(node.args) == 2 else _ints(node.args[1:])


def _dims(a: Any, b: Any, rank: int) -> set | None:
    if not (isinstance(a, int) and isinstance(b, int)):
        return None
    return {a % rank, b % rank}


def _head(view4: Any) -> tuple | None:
    """``view (B, H, L, D) ← transpose(0, 1) ← view (L, B·H, D) ← select(c, 0, i)``: (c, i, (B, H, L, D))."""
    if op_name(view4) not in ("view", "reshape") or len(view4.users) != 1:
        return None
    shape = _shape_arg(view4)
    t = view4.args[0]
    if shape is None or len(shape) != 4 or op_name(t) != "transpose" or not _only_user(t, view4):
        return None
    if _dims(_arg(t, 1, "dim0"), _arg(t, 2, "dim1"), 3) != {0, 1}:
        return None
    view3 = t.args[0]
    if op_name(view3) not in ("view", "reshape") or not _only_user(view3, t):
        return None
    b, h, l, d = shape
    if _shape_arg(view3) != (l, b * h, d):
        return None
    sel = view3.args[0]
    if op_name(sel) != "select" or not _only_user(sel, view3) or _arg(sel, 1, "dim") != 0:
        return None
    i = _arg(sel, 2, "index")
    return (sel.args[0], i, shape) if isinstance(i, int) else None


def _packed_projection(c: Any, e: int) -> tuple | None:
    """``contiguous ← squeeze(-2) ← transpose(0, -2) ← unsqueeze(0) ← unflatten(-1, (3, E)) ← linear(t, W, b)
    ← transpose(x, 0, 1)``: (the nodes from ``contiguous`` back to ``linear``, the linear node, x)."""
    if op_name(c) not in ("contiguous", "clone"):
        return None
    sq = c.args[0]
    if op_name(sq) != "squeeze" or not _only_user(sq, c) or len(sq.args) != 2 or sq.args[1] not in (-2, 3):
        return None
    tr = sq.args[0]
    if op_name(tr) != "transpose" or not _only_user(tr, sq) \
            or _dims(_arg(tr, 1, "dim0"), _arg(tr, 2, "dim1"), 5) != {0, 3}:
        return None
    un = tr.args[0]
    if op_name(un) != "unsqueeze" or not _only_user(un, tr) or _arg(un, 1, "dim") != 0:
        return None
    uf = un.args[0]
    if op_name(uf) != "unflatten" or not _only_user(uf, un) or _arg(uf, 1, "dim") not in (-1, 2) \
            or _ints(_arg(uf, 2, "sizes")) != (3, e):
        return None
    lin = uf.args[0]
    if op_name(lin) != "linear" or not _only_user(lin, uf) or lin.kwargs:
        return None
    t = lin.args[0]
    if op_name(t) != "transpose" or _dims(_arg(t, 1, "dim0"), _arg(t, 2, "dim1"), 3) != {0, 1}:
        return None
    return [c, sq, tr, un, uf, lin], lin, t.args[0]


def seq_first_qkv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, heads: int):
    """Q, K, V ``(B, H, L, D)`` of ``nn.MultiheadAttention``'s packed in-projection of ``x`` ``(B, L, E)``, as
    ``F.multi_head_attention_forward`` computes them from ``x.transpose(0, 1)``: the same ATen ops on the same
    rows (``linear`` where ATen's linear would take its contiguous path, else ``matmul`` then ``add_``), without
    the copies; the three are views of one ``(B, L, 3E)`` tensor."""
    seq_first = x.transpose(0, 1)
    if seq_first.is_contiguous():                  # (B or L is 1) ATen's linear takes addmm: the same call
        y = torch.nn.functional.linear(seq_first, weight, bias).transpose(0, 1)
    else:                                          # ATen's linear: matmul (copying the rows into order), add_
        y = torch.matmul(x, weight.t())
        if bias is not None:
            y.add_(bias)
    b, l, e3 = y.shape
    p = y.reshape(b, l, 3, heads, e3 // (3 * heads))
    return tuple(p.select(2, i).permute(0, 2, 1, 3) for i in range(3))


def batch_first_out(o: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The out-projection of SDPA's heads ``o`` ``(B, H, L, D)``, ``(B, L, E)``: the ``(L·B, E)`` rows
    ``F.multi_head_attention_forward`` gathers, in ``(B·L)`` order (a view where SDPA laid its output out as
    ``(B, L, H, D)``), through the same ``linear``."""
    b, h, l, d = o.shape
    return torch.nn.functional.linear(o.permute(0, 2, 1, 3).reshape(b * l, h * d), weight, bias).view(b, l, h * d)


def _out_side(sdpa: torch.fx.Node, b: int, l: int, e: int) -> tuple | None:
    """``permute(2, 0, 1, 3) ─ reshape (L·B, E) ─ linear ─ view (L, B, E) ─ transpose(0, 1)`` after SDPA: (its
    nodes, the linear, the final transpose)."""
    if len(sdpa.users) != 1:
        return None
    p = next(iter(sdpa.users))
    if op_name(p) != "permute" or _ints(_arg(p, 1, "dims")) != (2, 0, 1, 3) or len(p.users) != 1:
        return None
    r = next(iter(p.users))
    between = []
    if op_name(r) == "contiguous" and len(r.users) == 1:
        between, r = [r], next(iter(r.users))
    if op_name(r) not in ("reshape", "view") or _shape_arg(r) != (l * b, e) or len(r.users) != 1:
        return None
    lin = next(iter(r.users))
    if op_name(lin) != "linear" or lin.args[0] is not r or lin.kwargs or len(lin.users) != 1:
        return None
    v = next(iter(lin.users))
    if op_name(v) not in ("view", "reshape") or _shape_arg(v) != (l, b, e) or len(v.users) != 1:
        return None
    t = next(iter(v.users))
    if op_name(t) != "transpose" or _dims(_arg(t, 1, "dim0"), _arg(t, 2, "dim1"), 3) != {0, 1}:
        return None
    return [t, v, lin, r, *between, p], lin, t


def batch_first_heads(gm: torch.fx.GraphModule) -> int:
    """Rewrite each sequence-first ``nn.MultiheadAttention`` self-attention in ``gm`` (the packed in-projection
    read by one SDPA node, as ``F.multi_head_attention_forward`` writes it) to ``seq_first_qkv`` → SDPA →
    ``batch_first_out``; the out-projection only where it is the pattern above. Edits ``gm`` in place; returns how
    many attentions it rewrote."""
    done = 0
    graph = gm.graph
    for sdpa in list(graph.nodes):
        if op_name(sdpa) != "scaled_dot_product_attention" or len(sdpa.args) < 3:
            continue
        heads = [_head(a) for a in sdpa.args[:3]]
        if any(h is None for h in heads):
            continue
        (c, _, shape), *_ = heads
        if [h[1] for h in heads] != [0, 1, 2] or any(h[0] is not c or h[2] != shape for h in heads):
            continue
        if len(c.users) != 3:
            continue
        b, h, l, d = shape
        packed = _packed_projection(c, h * d)
        if packed is None:
            continue
        dead, lin, x = packed
        lin_input = lin.args[0]
        out = _out_side(sdpa, b, l, h * d)
        with graph.inserting_before(sdpa):
            qkv = graph.call_function(seq_first_qkv, (x, lin.args[1], lin.args[2] if len(lin.args) > 2 else None, h))
            new = [graph.call_function(operator.getitem, (qkv, i)) for i in range(3)]
        # the new nodes carry no recorded value: the nodes they replace had other strides (passes after this one
        # read a recorded value's strides, and a node without one as unknown)
        old_heads = list(sdpa.args[:3])
        sdpa.args = (*new, *sdpa.args[3:])
        if out is not None:
            out_dead, out_lin, last = out
            with graph.inserting_after(last):
                z = graph.call_function(batch_first_out,
                                        (sdpa, out_lin.args[1], out_lin.args[2] if len(out_lin.args) > 2 else None))
            last.replace_all_uses_with(z)
            for node in out_dead:                   # from the last back to the first
                graph.erase_node(node)
        for v4 in old_heads:                        # view ← transpose ← view ← select, then the packed chain
            t = v4.args[0]
            v3 = t.args[0]
            sel = v3.args[0]
            for node in (v4, t, v3, sel):
                graph.erase_node(node)
        for node in dead:
            graph.erase_node(node)
        seq_first = lin_input
        if not seq_first.users:                     # the transpose of x, read by the in-projection only
            graph.erase_node(seq_first)
        done += 1
    if done:
        graph.lint()
        gm.recompile()
    return done


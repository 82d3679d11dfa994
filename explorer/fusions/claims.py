"""Who claims a node that two families want: the residual add after a projection, before an RMSNorm.

::

    x ─► linear(W, b) ─► y ─┐
                            add ─► s ─► RMSNorm ─► ...
    r (the residual) ───────┘
         linear_residual wants the add in the GEMM's epilogue ("epilogue");
         rms_norm's Add+RMSNorm wants it as its first op ("norm")

The add a decoder writes after o_proj and down_proj (``residual + proj(h)``, transformers' Llama and Qwen2 as
captured) is both the end of a Linear + residual chain (``explorer.fusions.linear_residual``) and the start of an
Add+RMSNorm (``explorer.fusions.rms_norm``, and the γ fold over it, ``rms_fold``). ``residual_home(m, k, n)`` is
the one decision, per shape, from measurement (``RESIDUAL_EPILOGUE_WINS``: ``benchmarks/bench_rms_fold.py --only
linres``, the Triton GEMM with the residual in its epilogue + RMSNorm against cuBLAS + the fused Add+RMSNorm, in
the same run). The Add+RMSNorm matchers ask it and step aside with ``WORDS("epilogue_wins")`` where the epilogue
wins; linear_residual's matcher reports the add an Add+RMSNorm kept as its own near miss.

Why here and not in ``fusions.kernels``: this is a decision about the graph (which pattern claims which node, read
from the graph's recorded shapes), not about how a kernel runs; both families import it, neither imports the other.
It owns its words (``WORDS``, prefix ``claims``), merged into the registry's catalog beside ``base``'s.
"""

from __future__ import annotations

from explorer.vocab import TRANSPARENT
from explorer.words import Message, Words

#: What the claim between two families says to a person, in English and 中文 (rendered by explorer.ui.i18n by id).
WORDS = Words("claims", {
    "epilogue_wins": (("the residual add goes to the GEMM epilogue of {linear} (Triton GEMM with the residual, "
                       "then RMSNorm) at M={m}, K={k}, N={n}: {why}"),
                      "残差相加放进 {linear} 的 GEMM 尾处理（带残差的 Triton GEMM，然后 RMSNorm），M={m}、K={k}、N={n}：{why}"),
    "why.measured_faster": ("measured faster (benchmarks/results/bench_rms_fold_h200.json)",
                            "实测更快（benchmarks/results/bench_rms_fold_h200.json）"),
    "why.not_measured": ("the default; the GEMM epilogue was not measured faster at this shape",
                         "默认选择；在这个形状上没有测到 GEMM 尾处理更快"),
    "why.policy": ("forced by the policy RESIDUAL_OWNER={owner}", "由策略 RESIDUAL_OWNER={owner} 强制"),
})

#: Shapes ``(K, N)`` of a residual projection -> the smallest M (rows) from which the Triton GEMM with the residual
#: in its epilogue + RMSNorm measured faster than cuBLAS + the fused Add+RMSNorm on the H200 in bf16
#: (``benchmarks/bench_rms_fold.py --only linres``; committed as ``benchmarks/results/bench_rms_fold_h200.json``).
#: A shape not here keeps the add with the Add+RMSNorm.
RESIDUAL_EPILOGUE_WINS: dict[tuple[int, int], int] = {
    # the zoo decoder's o_proj (512 -> 512) at 16384 rows: 47.1 us against 57.8 (its down_proj, 1376 -> 512, and
    # every Llama-3-8B projection at 4096..16384 rows measured faster with cuBLAS + the fused Add+RMSNorm)
    (512, 512): 16384,
}

#: "measured" (``RESIDUAL_EPILOGUE_WINS``), or "epilogue" / "norm" everywhere (benchmarks compare them this way).
RESIDUAL_OWNER = "measured"

#: The Add+RMSNorm patterns that compete for the add after a projection (``residual_home`` decides).
NORM_PATTERNS = ("add_rms_norm", "add_rms_fold")


def residual_home(m: int, k: int, n: int) -> tuple[str, str]:
    """Where the add after a projection of ``m`` rows, ``k`` in and ``n`` out goes when an RMSNorm follows it:
    ``("epilogue" | "norm", why)`` (``why``: a message saying on what the decision rests)."""
    if RESIDUAL_OWNER in ("epilogue", "norm"):
        return RESIDUAL_OWNER, WORDS("why.policy", owner=RESIDUAL_OWNER)
    threshold = RESIDUAL_EPILOGUE_WINS.get((int(k), int(n)))
    if threshold is not None and m >= threshold:
        return "epilogue", WORDS("why.measured_faster")
    if threshold is not None:
        return "norm", WORDS("why.measured_faster")
    return "norm", WORDS("why.not_measured")


def projection_shape(g, linear: str) -> tuple[int, int, int] | None:
    """``(M, K, N)`` of a linear node of the graph (rows, in, out), from its recorded shapes."""
    out = (g.nodes[linear].get("shapes") or [None])[0]
    src = g.nodes[linear].get("first_input")
    inp = (g.nodes[src].get("shapes") or [None])[0] if src in g else None
    if not out or not inp:
        return None
    m = 1
    for d in out[:-1]:
        m *= int(d)
    return m, int(inp[-1]), int(out[-1])


def residual_projection(g, add: str) -> str | None:
    """The linear whose output the add ``add`` reads as one operand (through identity views, and read by nothing
    else): the projection whose epilogue could take the add; None if there is none."""
    for src in g.predecessors(add):
        node = src
        while g.nodes[node]["kind"] in TRANSPARENT and g.in_degree(node) == 1 and g.out_degree(node) == 1:
            node = next(iter(g.predecessors(node)))
        if g.nodes[node]["kind"] == "linear" and g.out_degree(node) == 1:
            return node
    return None


def epilogue_claim(g, add: str, claimed: dict[str, str]):
    """The near miss an Add+RMSNorm matcher raises for ``add`` when the projection before it takes the add into its
    GEMM epilogue (``residual_home`` says "epilogue"), else None: one message, ``WORDS("epilogue_wins")``."""
    projection = residual_projection(g, add)
    if projection is None or projection in claimed or not (shape := projection_shape(g, projection)):
        return None
    home, why = residual_home(*shape)
    if home != "epilogue":
        return None
    m, k, n = shape
    return WORDS("epilogue_wins", linear=projection, why=why, m=m, k=k, n=n)


def is_epilogue_claim(reason: object) -> bool:
    """Whether a near miss's reason is ``epilogue_claim``'s (the add given up to a projection's GEMM epilogue)."""
    return isinstance(reason, Message) and reason.id == f"{WORDS.prefix}.epilogue_wins"

"""Learn page: every pattern of the registry explained, beside its chains in the current model."""

from __future__ import annotations

import streamlit as st

from explorer.ui import state as ui_state
from explorer.graph_view import human_bytes
from explorer.fusions import PATTERNS

GENERAL = """
**Why fusion pays.** Each kernel launch costs ~5–20 µs of CPU-to-GPU dispatch, and every intermediate
tensor is written to device memory and read back. `conv → temp1 → bn → temp2 → relu` is three launches
and two round trips; the fused kernel is one launch and none. A ResNet-50 profile (the seed document):
~40 % compute, ~15 % launches, ~35 % intermediate memory traffic, ~10 % other.

**Precision.** Fusion reorders arithmetic (a folded BatchNorm rounds differently; fused softmax keeps
fp32 statistics). Expect differences near the dtype's rounding: ~1e-6 relative in fp32, ~1e-3 in
fp16/bf16. The Results page measures them against float64.

**Training vs inference.** BatchNorm folding is valid only with frozen (inference) statistics; in
training the batch statistics change every step. A fused op with a subtly wrong backward can slow
convergence: be careful with aggressive fusion in training, bold in inference.

**Not every fusion pays.** A fusion can lose in two ways. The fused kernel can be slower on the GPU
than the library kernels it replaces (register pressure, a worse algorithm: on an H200, cuDNN's fused
conv+bias+ReLU lost to the separate ops on 8 of ResNet-50's 33 Conv+BN+ReLU chains in fp16). Or the
fused call can cost the host more than the launches it saves: one Triton launch from Python took 24 µs of
host time there, against 18 µs for eager add + layer_norm, and a model whose GPU waits for the host gets
slower. On a GPU the Results page times every chain both ways (plain calls, and a CUDA graph that removes
the host) and says which it is. Measure, then reject the chains that lose or give them another kernel:
with the separate epilogue (conv, then ReLU in place) those 8 chains went from 0.56–0.79× to 0.99–1.26×
of the unfused speed, as CUDA graphs.

**The host is part of the machine.** Without CUDA graphs, a forward of BERT-base or ResNet-50 at batch 32
spends more time issuing calls from Python than the GPU spends running them. How each call is made
then matters as much as what is fused: the explorer times every graph "lean" (each ATen call through
its cheapest binding, each fused call resolved once to the library call it takes), which took fused
BERT-base from 3.75 to 3.16 ms and fused ResNet-50 fp16 from 3.23 to 2.39 ms on the H200, with the
same kernels. Horizontal fusion (one GEMM for the Q, K and V projections) saves host time too: three
linears cost 57 µs to issue there, one linear and a split 24 µs.
"""


def _steps_text(p) -> str:
    """``conv → batch_norm → relu/relu6/...``; siblings: ``linear ∥ linear ∥ …`` (two or more)."""
    if p.siblings:
        kinds = "/".join(sorted(p.steps[0].kinds))
        return f"{kinds} ∥ {kinds} ∥ … (two or more reading one input)"
    return p.joiner.join("/".join(sorted(s.kinds))[:40] + ("?" if s.optional else "") for s in p.steps)


def page() -> None:
    st.subheader("Operator fusion, pattern by pattern")
    st.markdown(GENERAL)
    cur = ui_state.current()
    detection = cur[3] if cur else None
    accepted = ui_state.accepted_ids(detection) if detection else set()
    for p in PATTERNS:
        chains = [c for c in detection.chains if c.pattern == p.name] if detection else []
        misses = [m for m in detection.near_misses if m.pattern == p.name] if detection else []
        title = f"{p.label} — {len(chains)} chain(s) in {cur[1].name}" if cur else p.label
        with st.expander(title, expanded=bool(chains)):
            left, right = st.columns([3, 2])
            with left:
                st.markdown(f"<span style='display:inline-block;width:14px;height:14px;background:{p.color};"
                            f"border-radius:3px;vertical-align:middle'></span> `{p.name}` · matches "
                            f"`{_steps_text(p)}`",
                            unsafe_allow_html=True)
                st.markdown(p.explanation)
                st.markdown(f"**Implementation:** {p.implementation}")
                if p.formula:
                    st.code(p.formula, language=None)
                for caveat in p.caveats:
                    st.markdown(f"- {caveat}")
            with right:
                if chains:
                    st.markdown("**In this model**")
                    st.dataframe([{"chain": c.id, "accepted": c.id in accepted,
                                   "origin": ", ".join(dict.fromkeys(c.names)),
                                   "saves": f"{c.launches_saved} launch(es), {human_bytes(c.bytes_saved)}"}
                                  for c in chains], hide_index=True, width="stretch")
                elif cur:
                    st.caption("Not found in this model.")
                if misses:
                    st.markdown("**Near misses**")
                    for m in misses[:8]:
                        st.markdown(f"- `{', '.join(m.nodes[:4])}`: {m.reason}")


ui_state.guarded(page)


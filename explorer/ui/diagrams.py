"""Before/after diagrams of a fusion, drawn by the app as inline SVG: which tensors go to device memory and back.

::

    on chip    [conv] ──► [bn] ──► [relu]            [ conv + bn + relu ]
                 ▲  ╲       ▲  ╲      ▲ ╲               ▲      t1, t2 stay   ╲
    device     x    t1 ─────┘   t2 ───┘   y            x       in registers    y
    memory

Top lane: the kernels (one box per launch). Bottom lane: device memory (显存):
the inputs, every intermediate written by one kernel and read back by the
next, and the outputs. Fused, the chain is one box; its intermediates stay in
registers (drawn inside the box, dashed) unless something outside the chain
reads one, which the fused kernel then still writes (``kept``). Sibling
linears (Q, K, V) read one input: three reads before, one after.

``spec_for_pattern`` builds the spec of a registry pattern (placeholder names
t1, t2, ...); ``spec_for_example`` the spec of a real chain of the model, with
the byte size of every tensor (``explorer.teaching.examples.TrafficExample``).
``svg`` draws one spec, unfused or fused, with the labels the caller gives
(translated by the page). No internet, no images: plain SVG text.
"""

from __future__ import annotations

import dataclasses
import html
from typing import Any

from explorer.units import human_bytes

#: Colours: kernels, device memory, tensors written and read back, tensors kept in registers.
KERNEL_FILL, MEMORY_FILL, ROUND_TRIP, ON_CHIP, INK = "#dbeafe", "#f3f4f6", "#dc2626", "#16a34a", "#1f2937"


@dataclasses.dataclass(frozen=True)
class DiagramSpec:
    """One chain to draw: its ops in order, its inputs, intermediates and outputs.

    ``intermediates`` are (label, size text, kept) after each op but the last;
    ``side_inputs`` are (op index, label) of operands read by a later op (a residual);
    ``siblings`` draws parallel ops reading the first input.
    """

    ops: tuple[str, ...]
    inputs: tuple[str, ...] = ("x",)
    intermediates: tuple[tuple[str, str, bool], ...] = ()
    side_inputs: tuple[tuple[int, str], ...] = ()
    outputs: tuple[str, ...] = ("y",)
    siblings: bool = False
    color: str = "#1f77b4"



#: The diagrams' font: Streamlit's own family, which the app extends with its CJK subset (explorer/ui/fonts.py),
#: so that a diagram drawn inline in the page shows its Chinese on any machine.
FONT_FAMILY = "'Source Sans', sans-serif"


def fit_width(svg_text: str) -> str:
    """An ``svg`` drawing scaled to the width of its column (its viewBox keeps the proportions)."""
    return svg_text.replace("<svg ", '<svg style="width:100%;height:auto" ', 1)

def _short(kinds: Any) -> str:
    kinds = sorted(kinds)
    return kinds[0] if len(kinds) == 1 else f"{kinds[0]}/…"


def spec_for_pattern(pattern: Any) -> DiagramSpec:
    """The spec of a registry pattern: its required steps (and optional ones in brackets), placeholder names."""
    if pattern.siblings:
        kind = _short(pattern.steps[0].kinds)
        return DiagramSpec(ops=(kind, kind, kind), siblings=True, outputs=("y1", "y2", "y3"), color=pattern.color)
    ops, side = [], []
    for step in pattern.steps:
        label = _short(step.kinds)
        ops.append(f"[{label}]" if step.optional else label)
        if step.kinds & {"add"} and len(ops) > 1 and step.role in ("add", "mask"):
            side.append((len(ops) - 1, "z" if step.role == "add" else "mask"))
        elif step.kinds & {"matmul"} and len(ops) > 1:
            side.append((len(ops) - 1, "v"))
    inter = tuple((f"t{i + 1}", "", False) for i in range(len(ops) - 1))
    inputs = ("x", "r") if ops and ops[0] == "add" else ("x",)
    return DiagramSpec(ops=tuple(ops), inputs=inputs, intermediates=inter, side_inputs=tuple(side),
                       color=pattern.color)


def spec_for_example(example: Any, color: str = "#1f77b4") -> DiagramSpec:
    """The spec of a real chain (``TrafficExample``): its ops' kinds and the size of every intermediate."""
    ops = tuple(o["kind"] for o in example.ops)
    if example.siblings:
        size = human_bytes(example.intermediates[0]["bytes"]) if example.intermediates else ""
        return DiagramSpec(ops=ops, inputs=(f"x {size}".strip(),), siblings=True,
                           outputs=tuple(f"y{i + 1}" for i in range(len(ops))), color=color)
    inter = tuple((f"t{i + 1}", human_bytes(t["bytes"]), bool(t["kept"])) for i, t in enumerate(example.intermediates))
    external = list(getattr(example, "external_inputs", ()) or [])
    first = [e for e in external if e["op_index"] == 0] or [{"bytes": 0}]
    names = ("a", "b", "c", "d") if ops and ops[0] in ("matmul", "bmm") else ("x", "r", "x3", "x4")
    inputs = tuple(f"{names[min(i, 3)]} {human_bytes(e['bytes'])}".strip() if e["bytes"] else names[min(i, 3)]
                   for i, e in enumerate(first[:3]))
    side = tuple((e["op_index"], f"z{j + 1} {human_bytes(e['bytes'])}")
                 for j, e in enumerate(e for e in external if e["op_index"] > 0))
    return DiagramSpec(ops=ops, inputs=inputs, intermediates=inter, side_inputs=side, color=color)


def _text(x: float, y: float, s: str, size: int = 12, anchor: str = "middle", color: str = INK,
          weight: str = "normal") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" fill="{color}" '
            f'font-weight="{weight}" font-family="{FONT_FAMILY}">{html.escape(s)}</text>')


def _arrow(x1: float, y1: float, x2: float, y2: float, color: str, dashed: bool = False) -> str:
    dash = ' stroke-dasharray="5,4"' if dashed else ""
    return (f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{color}" stroke-width="2"'
            f'{dash} marker-end="url(#arrow-{color[1:]})"/>')


def _defs(colors: set[str]) -> str:
    markers = "".join(
        f'<marker id="arrow-{c[1:]}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        f'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="{c}"/></marker>' for c in sorted(colors))
    return f"<defs>{markers}</defs>"


def _tensor(x: float, y: float, label: str, size: str, color: str) -> str:
    w = max(40, 8 * max(len(label), len(size)) + 14)
    parts = [f'<rect x="{x - w / 2:.1f}" y="{y - 16:.1f}" width="{w:.1f}" height="{34 if size else 24}" rx="5" '
             f'fill="white" stroke="{color}" stroke-width="1.5"/>', _text(x, y + 1, label, 14)]
    if size:
        parts.append(_text(x, y + 14, size, 12, color="#4b5563"))
    return "".join(parts)


def svg(spec: DiagramSpec, fused: bool, labels: dict[str, str], width: int = 600) -> str:
    """The diagram of ``spec``, unfused (one box per op) or ``fused`` (one box), as an SVG string.

    ``labels`` (already translated): "chip" (the top lane's name), "memory" (the
    bottom lane's), "kept_on_chip" (said of intermediates inside the fused box),
    "caption" (one line under the drawing: launches and round trips).
    """
    two_rows = bool(spec.side_inputs)
    height = 290 if two_rows else 250
    chip_y, mem_y = 62, 172
    row2 = mem_y + 44          # side inputs (a residual, the second operand of a later op)
    left, right = 70, width - 20
    colors = {ROUND_TRIP, ON_CHIP, INK}
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
             f'role="img" aria-label="{html.escape(labels.get("caption", ""))}">', _defs(colors)]
    lane = 108 if two_rows else 68
    parts.append(f'<rect x="4" y="{mem_y - 34}" width="{width - 8}" height="{lane}" rx="8" fill="{MEMORY_FILL}"/>')
    parts.append(_text(10, chip_y - 34, labels.get("chip", "on chip"), 13, "start", "#6b7280"))
    parts.append(_text(10, mem_y - 34 + lane + 16, labels.get("memory", "device memory"), 13, "start", "#6b7280"))
    n = len(spec.ops)
    if spec.siblings:
        x_in = left + 10
        parts.append(_tensor(x_in, mem_y, spec.inputs[0], "", INK))
        if fused:
            cx = (left + right) / 2
            parts.append(f'<rect x="{cx - 120:.1f}" y="{chip_y - 20}" width="240" height="40" rx="8" '
                         f'fill="{KERNEL_FILL}" stroke="{spec.color}" stroke-width="2"/>')
            parts.append(_text(cx, chip_y + 5, " | ".join(spec.ops), 12, weight="bold"))
            parts.append(_arrow(x_in, mem_y - 16, cx - 100, chip_y + 21, INK))
            for i, out in enumerate(spec.outputs):
                ox = cx + 40 + i * 70
                parts.append(_tensor(ox, mem_y, out, "", INK))
                parts.append(_arrow(cx + 20 + i * 30, chip_y + 21, ox, mem_y - 16, INK))
        else:
            step = (right - left - 80) / max(n, 1)
            for i, op in enumerate(spec.ops):
                bx = left + 80 + step * i + step / 2
                parts.append(f'<rect x="{bx - 45:.1f}" y="{chip_y - 20}" width="90" height="40" rx="8" '
                             f'fill="{KERNEL_FILL}" stroke="{spec.color}" stroke-width="2"/>')
                parts.append(_text(bx, chip_y + 5, op, 14, weight="bold"))
                parts.append(_arrow(x_in, mem_y - 16, bx - 30, chip_y + 21, ROUND_TRIP))
                out = spec.outputs[i] if i < len(spec.outputs) else f"y{i + 1}"
                parts.append(_tensor(bx + 25, mem_y, out, "", INK))
                parts.append(_arrow(bx + 10, chip_y + 21, bx + 25, mem_y - 16, INK))
        parts.append(_text(width / 2, height - 4, labels.get("caption", ""), 14, weight="bold"))
        parts.append("</svg>")
        return "".join(parts)

    x_in = left + 10
    for i, name in enumerate(spec.inputs):
        label, _, size = name.partition(" ")
        parts.append(_tensor(x_in + 84 * i, mem_y, label, size, INK))
    x_out = right - 30
    if fused:
        x0, x1 = left + 60 + 84 * (len(spec.inputs) - 1), x_out - 60
        parts.append(f'<rect x="{x0:.1f}" y="{chip_y - 22}" width="{x1 - x0:.1f}" height="44" rx="8" '
                     f'fill="{KERNEL_FILL}" stroke="{spec.color}" stroke-width="2.5"/>')
        fused_label = " + ".join(op.strip("[]") for op in spec.ops)
        parts.append(_text((x0 + x1) / 2, chip_y - 4, fused_label, _fit(fused_label, x1 - x0), weight="bold"))
        stay = [t for t in spec.intermediates if not t[2]]
        if stay:
            parts.append(_text((x0 + x1) / 2, chip_y + 14, f"{', '.join(t[0] for t in stay)}: "
                               f"{labels.get('kept_on_chip', 'stay in registers')}", 13, color=ON_CHIP))
        for i in range(len(spec.inputs)):
            parts.append(_arrow(x_in + 84 * i, mem_y - 16, x0 + 20 + 12 * i, chip_y + 23, INK))
        for j, (_op_index, name) in enumerate(spec.side_inputs):
            sx = x0 + (x1 - x0) * (j + 1) / (len(spec.side_inputs) + 1)
            label, _, size = name.partition(" ")
            parts.append(_tensor(sx, row2, label, size, INK))
            parts.append(_arrow(sx, row2 - 17, sx, chip_y + 23, INK))
        kept = [t for t in spec.intermediates if t[2]]
        for j, (name, size, _) in enumerate(kept):
            kx = x1 - 60 - 80 * j
            parts.append(_tensor(kx, mem_y, name, size, ROUND_TRIP))
            parts.append(_arrow(kx + 10, chip_y + 23, kx, mem_y - 16, ROUND_TRIP))
        parts.append(_tensor(x_out, mem_y, spec.outputs[0], "", INK))
        parts.append(_arrow(x1 - 10, chip_y + 23, x_out, mem_y - 16, INK))
    else:
        start = left + 60 + 84 * (len(spec.inputs) - 1)
        step = (x_out - 40 - start) / max(n, 1)
        centers = [start + step * i + step / 2 for i in range(n)]
        box = min(step - 24, 110)
        for i, (cx, op) in enumerate(zip(centers, spec.ops)):
            dash = ' stroke-dasharray="4,3"' if op.startswith("[") else ""  # an optional step
            parts.append(f'<rect x="{cx - box / 2:.1f}" y="{chip_y - 20}" width="{box:.1f}" height="40" rx="8" '
                         f'fill="{KERNEL_FILL}" stroke="{spec.color}" stroke-width="2"{dash}/>')
            parts.append(_text(cx, chip_y + 5, op, _fit(op, box), weight="bold"))
        for i in range(len(spec.inputs)):
            parts.append(_arrow(x_in + 84 * i, mem_y - 16, centers[0] - box / 4 + 8 * i, chip_y + 21, INK))
        for i, (name, size, kept) in enumerate(spec.intermediates):
            tx = (centers[i] + centers[i + 1]) / 2
            parts.append(_tensor(tx, mem_y, name, size, ROUND_TRIP))
            parts.append(_arrow(centers[i] + box / 4, chip_y + 21, tx - 6, mem_y - 16, ROUND_TRIP))
            parts.append(_arrow(tx + 6, mem_y - 16, centers[i + 1] - box / 4, chip_y + 21, ROUND_TRIP))
        for op_index, name in spec.side_inputs:
            sx = centers[op_index]
            label, _, size = name.partition(" ")
            parts.append(_tensor(sx, row2, label, size, INK))
            parts.append(_arrow(sx, row2 - 17, sx, chip_y + 21, INK))
        parts.append(_tensor(x_out, mem_y, spec.outputs[0], "", INK))
        parts.append(_arrow(centers[-1] + box / 4, chip_y + 21, x_out, mem_y - 16, INK))
    parts.append(_text(width / 2, height - 4, labels.get("caption", ""), 14, weight="bold"))
    parts.append("</svg>")
    return "".join(parts)


def _fit(label: str, box: float, largest: int = 14) -> int:
    """A font size at which ``label`` fits in a box ``box`` wide (about 0.62 em per character)."""
    return int(max(9, min(largest, (box - 8) / (0.62 * max(len(label), 1)))))


def counts(spec: DiagramSpec, fused: bool) -> dict[str, int]:
    """Launches and round trips through device memory that the drawing shows (for its caption)."""
    if spec.siblings:
        return {"launches": 1 if fused else len(spec.ops), "round_trips": 0,
                "input_reads": 1 if fused else len(spec.ops)}
    trips = sum(1 for t in spec.intermediates if (t[2] or not fused))
    return {"launches": 1 if fused else len(spec.ops), "round_trips": trips, "input_reads": 1}

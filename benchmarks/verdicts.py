"""The paired verdict between any two variants of a model benchmark's JSON, from the rounds it kept.

The model benches (``bench_cnn_fusions.py``, ``bench_llm_fusions.py``) decide their two targets
themselves; every variant's per-round times (``samples_ms``) stay in the JSON, so any other pair
timed in the same session can be tested afterwards with the same test
(``explorer.stats.compare``: Wilcoxon signed-rank over the paired rounds, 3% minimum effect)::

    python3 benchmarks/verdicts.py benchmarks/results/bench_cnn_fusions_convnext_tiny_quick_h200.json fused eager
    python3 benchmarks/verdicts.py FILE fused fused_mlp_on_triton_gemms --model convnext_tiny

Prints one line (the ratio candidate / baseline with its 95% interval, p, rounds) and exits 0; an
unknown file, model or variant is one line on stderr and exit 2. Runs anywhere: it reads a JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from explorer import stats  # noqa: E402


def model_results(doc: dict, model: str | None) -> tuple[str, dict]:
    """``(key, result)`` of the model part named ``model``, or of the only one; ``KeyError`` with a reason."""
    if not isinstance(doc, dict):
        raise KeyError("not a model benchmark's JSON (no model parts)")
    parts = {k: v for k, v in doc.items() if isinstance(v, dict) and isinstance(v.get("variants"), dict)}
    if model is not None:
        if model not in parts:
            raise KeyError(f"no model '{model}' in this file (it has: {', '.join(parts) or 'none'})")
        return model, parts[model]
    if len(parts) != 1:
        raise KeyError(f"pass --model: this file has {', '.join(parts) or 'no model parts'}")
    return next(iter(parts.items()))


def verdict(doc: dict, candidate: str, baseline: str, model: str | None = None) -> tuple[str, stats.Verdict]:
    """The paired verdict of ``candidate`` against ``baseline`` (session 1's rounds of one model part)."""
    key, result = model_results(doc, model)
    variants = result["variants"]
    for v in (candidate, baseline):
        if v not in variants or not variants[v].get("samples_ms"):
            raise KeyError(f"no rounds of '{v}' in {key} (variants: {', '.join(variants)})")
    if len(variants[candidate]["samples_ms"]) != len(variants[baseline]["samples_ms"]):
        raise KeyError(f"'{candidate}' and '{baseline}' were not timed in the same rounds")
    return key, stats.compare(variants[baseline]["samples_ms"], variants[candidate]["samples_ms"],
                              basis=f"{key}: {candidate} against {baseline}, paired rounds")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("candidate")
    parser.add_argument("baseline")
    parser.add_argument("--model", default=None, help="the model part, where the file has several")
    args = parser.parse_args(argv)
    try:
        doc = json.loads(Path(args.file).read_text())
        key, v = verdict(doc, args.candidate, args.baseline, args.model)
    except (OSError, ValueError, KeyError) as exc:
        reason = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        print(f"verdicts.py: {reason}", file=sys.stderr)
        return 2
    interval = f"[{v.ci_low:.3f}, {v.ci_high:.3f}]" if v.ci_low is not None else "[no interval]"
    print(f"{key}: {args.candidate} / {args.baseline} = {v.ratio:.3f} {interval}: {v.label} "
          f"(p = {v.p_value:.2g}, {v.n} rounds{'; ' + v.note if v.note else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

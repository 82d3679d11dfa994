"""The ``fusion-explorer`` command line.

    fusion-explorer models
    fusion-explorer detect MODEL [--json] [--batch N] [--seq-len N]
    fusion-explorer plan MODEL --accept all|none|PATTERN[,PATTERN...] [--reject ID,...]
                               [--reject-slower report.json] [--kernel ID=CHOICE ...]
                               [--separate-gpu-slower report.json] [--out plan.json]
    fusion-explorer run MODEL --plan plan.json [--device cuda|cpu] [--dtype fp32|fp16|bf16]
                              [--batch N] [--seq-len N] [--quick] [--baselines]
                              [--compile-modes default,reduce-overhead,...] --out report.json
    fusion-explorer sweep [SWEEP.toml] --out DIR [--models M,M --plan P ... --batches N,N --dtypes D,D ...]
                          [--backend local|ray] [--ray-address ADDR] [--workers N] [--force]
    fusion-explorer compare-compile MODEL [--json] [--mode default|reduce-overhead|max-autotune|...]
                                          [--device auto|cuda|cpu] [--dtype fp32|fp16|bf16]
    fusion-explorer app [--port N] [--address HOST] [--headless] [STREAMLIT ARGS...]

MODEL is a zoo name or a path (.onnx, .pt2, a Hugging Face folder). Every
user error, argument errors included, prints one line on stderr and exits with
status 2; nothing prints a traceback. Text that comes from a file (node and
model names, messages quoting them) goes through ``clean``
(``explorer.terminal.visible``) before it reaches the terminal: a control or
bidi character shows as a visible escape, so a name can neither carry escape
sequences nor forge a line or a column of a table.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
import os
import sys
from pathlib import Path
from typing import Sequence

from explorer.errors import ExplorerError, PlanError, ReportError
from explorer.report import summary_table
from explorer.terminal import visible, visible_lines
from explorer.units import human_bytes
from explorer.vocab import DEVICE_NAMES, DTYPE_NAMES, MEMORY_FORMATS, parse_device, parse_dtype, parse_memory_format

EXIT_USAGE = 2


def clean(text: object) -> str:
    """``text`` made safe for a terminal (``explorer.terminal.visible``): every control and bidi
    character, escape sequences' ESC included, shown as a visible escape on one line. Every string
    the CLI prints that may come from a file goes through here."""
    return visible(text)


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line and exit status 2 (no usage block)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{self.prog}: error: {clean(' '.join(message.split()))}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def cmd_models(args: argparse.Namespace) -> int:
    from explorer.sources import zoo

    rows = [(e.name, e.family, e.inputs.describe(), e.description) for e in zoo.ZOO.values()]
    if args.json:
        print(json.dumps([{"name": n, "family": f, "input": i, "description": d} for n, f, i, d in rows], indent=2))
        return 0
    width = max(len(r[0]) for r in rows)
    for name, family, inputs, desc in rows:
        print(f"{name:<{width}}  {family:<11}  {desc}\n{'':<{width}}  {'':<11}  input: {inputs}")
    return 0


#: The devices ``detect`` counts kernel launches for (each chain's kernel differs between them).
LAUNCH_DEVICES = ("cpu", "cuda")


def cmd_detect(args: argparse.Namespace) -> int:
    from explorer.fusion_engine import analyze, chain_launch_table
    from explorer.fusions import BY_NAME, PATTERNS

    analysis = analyze(args.model, batch=args.batch, seq_len=args.seq_len)
    model, graph, det = analysis
    result = det.to_dict()
    result["model"] = model.name
    result["source"] = model.source
    # the launches each device saves, with each chain's kernel there (explorer.launches: the pages' count)
    tables = {dev: chain_launch_table(analysis, None, dev) for dev in LAUNCH_DEVICES}
    result["launches_by_device"] = {
        dev: {"before": tab.before, "after": tab.after, "saved": tab.saved,
              "chains": {c.chain_id: {"unfused": c.unfused, "fused": c.fused} for c in tab.chains}}
        for dev, tab in tables.items()}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    t = det.totals
    print(f"{clean(model.name)} ({clean(model.source)}): {t.get('nodes', 0)} nodes, {t.get('ops', 0)} ops, "
          f"{t.get('params', 0) / 1e6:.1f} M params, {t.get('flops', 0) / 1e9:.2f} GFLOP, "
          f"{human_bytes(t.get('bytes', 0))} moved unfused")
    print()
    width = max(len(p.label) for p in PATTERNS)
    heads = "".join(f" {'saves ' + dev:>11}" for dev in LAUNCH_DEVICES)
    print(f"{'id':<34} {'pattern':<{width}} {'bytes saved':>12}{heads}  chain")
    for c in det.chains:
        saved = "".join(f" {tables[dev].of(c.id).saved:>11}" for dev in LAUNCH_DEVICES)
        print(f"{clean(c.id):<34} {BY_NAME[c.pattern].label:<{width}} {human_bytes(c.bytes_saved):>12}"
              f"{saved}  {clean(c.title)}")
    print()
    print("chains per pattern: " + ", ".join(f"{p.label} {det.counts[p.name]}" for p in PATTERNS if det.counts[p.name]))
    print(f"total: {len(det.chains)} chains, {human_bytes(result['bytes_saved'])} of intermediate traffic saved; "
          "kernel launches (each chain's kernel on that device): "
          + ", ".join(f"{dev} {tab.before} -> {tab.after} (saves {tab.saved})" for dev, tab in tables.items()))
    if det.alternatives:
        print(f"\nalso possible ({len(det.alternatives)}; choose one with: fusion-explorer plan MODEL --use ID):")
        for a in det.alternatives:
            words = ", then ".join(BY_NAME[c.pattern].label for c in a.chains)
            print(f"  instead of {clean(a.instead_of)}: {words}  [{clean(a.id)}]")
    if det.near_misses:
        print(f"\nnear misses ({len(det.near_misses)}):")
        for m in det.near_misses:
            print(f"  {BY_NAME[m.pattern].label:<{width}} {clean(' -> '.join(m.nodes))}: {clean(m.reason)}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from explorer.fusion_engine import analyze
    from explorer.fusions.plan import make_plan

    if args.out:
        _check_out(args.out, "the plan")
    reports = {path: _read_report(path) for path in (args.reject_slower, args.separate_gpu_slower) if path}
    _, _, det = analyze(args.model, batch=args.batch, seq_len=args.seq_len)
    for path, report in reports.items():
        _check_report_model(report, det, path)
    reject = [r.strip() for r in (args.reject or "").split(",") if r.strip()]
    if args.reject_slower:
        from explorer.fusions.plan import slower_chains

        known = {c.id for c in det.chains}
        reject += [c for c in slower_chains(reports[args.reject_slower]) if c in known and c not in reject]
    kernels = {}
    for item in args.kernel or []:
        chain_id, sep, choice = item.partition("=")
        if not sep or not chain_id.strip() or not choice.strip():
            raise ExplorerError(f"--kernel takes CHAIN_ID=CHOICE, got '{item}'")
        kernels[chain_id.strip()] = choice.strip()
    if args.separate_gpu_slower:
        from explorer.fusions.plan import gpu_slower_chains

        for chain_id in gpu_slower_chains(reports[args.separate_gpu_slower], det):
            kernels.setdefault(chain_id, "separate_epilogue")
    plan = make_plan(det, accept=args.accept, reject=reject, memory_format=args.memory_format,
                     cuda_graphs=args.cuda_graphs, kernels=kernels)
    if args.use:
        from explorer.fusions.plan import choose_alternative

        for alternative in args.use:
            plan = choose_alternative(plan, det, alternative.strip())
    if args.out:
        _write_out(args.out, plan.to_json() + "\n", "the plan")
    else:
        print(plan.to_json())
    return 0


def _read_report(path: str):
    """A runner report for ``--reject-slower``/``--separate-gpu-slower``: the typed report
    (``explorer.report.load``: a regular JSON file of bounded size and depth, every field checked;
    version 1 reports are upgraded)."""
    from explorer import report as run_report

    return run_report.load(Path(path), f"report {path}")


def _check_report_model(report, det, path: str) -> None:
    """Refuse a report measured on another model (its graph fingerprint), in one line."""
    if report.model.fingerprint != det.fingerprint:
        raise ReportError(f"report {path} was measured on model '{str(report.model.name)[:80]}' "
                          f"(graph {report.model.fingerprint[:40]}), not on '{det.model}' (graph {det.fingerprint})")
    known = {c.id for c in det.chains}
    unknown = [c.id for c in report.chains if c.id not in known]
    if unknown:
        raise ReportError(f"report {path} names chains '{det.model}' does not have ({unknown[0][:80]}, ...): "
                          "it was measured on another model")


def _check_out(path: str, what: str = "the report") -> None:
    """Refuse an ``--out`` that cannot be written, before anything is measured or computed."""
    if "\x00" in path:
        raise ExplorerError("--out holds a NUL byte")
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise ExplorerError(f"cannot write {what} to {path}: the folder {folder} does not exist")
    if target.is_dir():
        raise ExplorerError(f"cannot write {what} to {path}: it is a folder")
    if not os.access(folder, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise ExplorerError(f"cannot write {what} to {path}: permission denied")


def _write_out(path: str, text: str, what: str) -> None:
    """Write ``text`` to ``path`` once everything has succeeded: into a temporary file beside it, then renamed
    over it, so that a failure (here or before) never leaves an empty or half-written file."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.part")
    try:
        tmp.write_text(text)
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ExplorerError(f"cannot write {what} to {path}: {exc.strerror}") from None


def cmd_run(args: argparse.Namespace) -> int:
    from explorer import gpu_runner
    from explorer.fusions.plan import MAX_PLAN_BYTES, Plan

    from explorer import jsonfile

    if args.out:
        _check_out(args.out)
    plan = None
    if args.plan:
        plan = Plan.from_dict(jsonfile.read_json_file(args.plan, f"plan {args.plan}", PlanError, MAX_PLAN_BYTES))
    _check_source(args.model, args.batch, args.seq_len)
    modes = tuple(m.strip() for m in (args.compile_modes or "").split(",") if m.strip())
    settings = gpu_runner.RunSettings(device=args.device, dtype=args.dtype, batch=args.batch,
                                      seq_len=args.seq_len, per_chain=not args.no_chains,
                                      stages=not args.no_stages, quick=args.quick, cpu_threads=args.cpu_threads,
                                      compile_baseline=bool(args.baselines or modes),
                                      **({"compile_modes": modes} if modes else {}))

    def progress(fraction: float, status: str) -> None:
        print(f"[{fraction * 100:5.1f}%] {clean(status)}", file=sys.stderr, flush=True)

    report = gpu_runner.run(args.model, plan, settings, progress=progress)
    text = report.to_json(indent=2)
    if args.out:
        _write_out(args.out, text, "the report")
    else:
        print(text)
    print(visible_lines(summary_table(report)), file=sys.stderr)
    if report.host is not None and report.host.busy:
        print(f"warning: {report.host.warning()}", file=sys.stderr)
    return 0


def _csv(text: str | None, convert=str, what: str = "value") -> list:
    """``a,b`` as a list (empty for None); a value ``convert`` refuses is one line."""
    out = []
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        try:
            out.append(convert(item))
        except (ValueError, argparse.ArgumentTypeError):
            raise ExplorerError(f"--{what} takes values separated by commas; '{item[:80]}' is not one") from None
    return out


def _on_off(text: str) -> bool:
    if text in ("on", "true", "yes"):
        return True
    if text in ("off", "false", "no"):
        return False
    raise ValueError(text)


#: The sweep's axis and setting flags (``fusion-explorer sweep``): with a sweep file, none of them may be given.
SWEEP_FLAGS = ("models", "plans", "batches", "seq_lens", "dtypes", "memory_formats", "cuda_graphs_axis",
               "baselines_axis", "device", "quick", "per_chain", "stages", "timeout_s", "cpu_threads",
               "warmup", "reps")


def cmd_sweep(args: argparse.Namespace) -> int:
    from explorer.sweeps import runner, spec as sweep_spec

    given = [f for f in SWEEP_FLAGS if getattr(args, f) not in (None, False, [])]
    if args.sweep_file:
        if given:
            raise ExplorerError(f"give a sweep file or the flags of a sweep, not both (--{given[0].replace('_', '-')})")
        spec = sweep_spec.load_spec(args.sweep_file)
    else:
        if not args.models:
            raise ExplorerError("a sweep needs a sweep file (.toml, .yaml) or --models, --batches and --dtypes")
        settings = {k: v for k, v in (("device", args.device), ("timeout_s", args.timeout_s),
                                      ("cpu_threads", args.cpu_threads), ("warmup", args.warmup),
                                      ("reps", args.reps)) if v is not None}
        settings.update({k: True for k in ("quick", "per_chain", "stages") if getattr(args, k)})
        spec = sweep_spec.from_flags(
            _csv(args.models, what="models"), args.plans or ["all"], _csv(args.batches, int, "batches") or [1],
            _csv(args.dtypes, what="dtypes") or ["fp32"], _csv(args.seq_lens, int, "seq-lens"),
            _csv(args.memory_formats, what="memory-formats") or ["nchw"],
            _csv(args.cuda_graphs_axis, _on_off, "cuda-graphs") or [False],
            _csv(args.baselines_axis, _on_off, "baselines") or [False], settings)
    if args.allow_mixed_gpus or args.workers_per_gpu:
        import dataclasses

        changed = {"allow_mixed_gpus": True} if args.allow_mixed_gpus else {}
        if args.workers_per_gpu:   # how the points are scheduled, not what they measure: also over a sweep file
            if args.workers_per_gpu > 16:
                raise ExplorerError(f"--workers-per-gpu {args.workers_per_gpu}: at most 16")
            changed["workers_per_gpu"] = args.workers_per_gpu
        spec = dataclasses.replace(spec, settings=dataclasses.replace(spec.settings, **changed))
    if args.ray_address and args.backend != "ray":
        raise ExplorerError("--ray-address needs --backend ray")
    tty = sys.stderr.isatty()
    last = {"line": "", "t": 0.0}

    def progress(p) -> None:
        import time

        line = p.line()
        counts = line.split(" · ")[0]
        if tty:
            print(f"\r\x1b[2K[{p.fraction * 100:5.1f}%] {clean(line)}", end="", file=sys.stderr, flush=True)
        elif counts != last["line"] or time.monotonic() - last["t"] > 30 or p.status != "running":
            print(f"[{p.fraction * 100:5.1f}%] {clean(line)}", file=sys.stderr, flush=True)
            last.update(line=counts, t=time.monotonic())

    summary = runner.run_sweep(spec, args.out, args.backend, ray_address=args.ray_address,
                               cpu_workers=args.workers or 1, force=args.force, progress=progress,
                               stop_after_s=args.stop_after_s)
    if tty:
        print(file=sys.stderr)
    for rec in summary.records:
        if rec["status"] == "ok":
            ci = (f" [{rec['speedup_low']:.2f}, {rec['speedup_high']:.2f}]"
                  if rec["speedup_low"] is not None and rec["speedup_high"] is not None else "")
            what = f"{rec['verdict']}: {rec['speedup']:.2f}x{ci}" if rec["speedup"] is not None else str(rec["verdict"])
        else:
            what = f"{rec['status']}: {rec['reason']}"
        print(clean(f"{rec['point']}  {what}"))
    print(clean(f"sweep folder: {summary.folder} ({summary.progress.line()})"), file=sys.stderr)
    return 0 if summary.progress.status == "done" else 1
def cmd_compare_compile(args: argparse.Namespace) -> int:
    """Our chains beside torch.compile's kernels (``explorer.runtime.compile_map``)."""
    from explorer.fusion_engine import analyze
    from explorer.fusions import BY_NAME
    from explorer.runtime import compile_map as cm

    _check_source(args.model, args.batch, args.seq_len)
    analysis = analyze(args.model, batch=args.batch, seq_len=args.seq_len)

    def progress(fraction: float, status: str) -> None:
        if not args.json:
            print(f"[{fraction * 100:5.1f}%] {clean(status)}", file=sys.stderr, flush=True)

    cmap, comparison = cm.for_analysis(analysis, args.model, args.device, args.dtype, args.mode,
                                       timeout_s=args.timeout, progress=progress)
    if args.json:
        print(json.dumps({"model": analysis.model.name, "compile_map": cmap.to_dict(),
                          "comparison": comparison.to_dict()}, indent=2))
        return 0
    kinds = ", ".join(f"{n} {cm.kind_label(k)}" for k, n in sorted(Counter(k.kind for k in cmap.kernels).items()))
    print(f"{clean(cmap.model)} on {cmap.device} ({cmap.dtype}, torch.compile {cmap.mode}, torch {cmap.torch_version}): "
          f"{len(cmap.kernels)} kernels ({kinds}), compiled in {cmap.compile_s:.1f} s")
    words = {"both": "both", "partly": "partly (inductor fuses part)", "ours": "ours only"}
    print(f"\nour chains ({len(comparison.chains)}):")
    for c in comparison.chains:
        print(f"  {clean(c.chain_id):<34} {BY_NAME[c.pattern].label:<22} {words[c.status]:<28} "
              f"{clean(', '.join(c.kernels)) or '-'}")
    print(f"\ninductor kernels ({len(cmap.kernels)}):")
    for k in cmap.kernels:
        extra = f"  (also touches {clean(', '.join(k.touches))})" if k.touches else ""
        print(f"  {clean(k.key):<48} {cm.kind_label(k.kind, k.library):<20} {clean(', '.join(k.nodes)) or '-'}{extra}")
    print(f"\ngroups only inductor fuses ({len(comparison.only_inductor)}):")
    for ops, n in comparison.candidate_patterns():
        print(f"  {clean(ops)}  x{n}")
    for g in comparison.only_inductor:
        print(f"    {clean(g.kernel)}: {clean(', '.join(g.nodes))}")
    print(f"\nops inductor leaves as separate kernels ({len(comparison.separate)}):")
    for node, kind, key in comparison.separate:
        print(f"  {clean(node):<24} {kind:<14} {clean(key)}")
    if comparison.no_kernel:
        print(f"\nops with no kernel of their own (folded or reinterpreted): {clean(', '.join(comparison.no_kernel))}")
    return 0


def _check_source(source: str, batch: int | None, seq_len: int | None) -> None:
    """Before a run: a zoo name must exist and its inputs fit; a file must load in the isolated
    loader (one line when not), so that a bad model fails before the runner starts."""
    from explorer.sources import check_source, zoo

    if source in zoo.ZOO:
        zoo.get_entry(source).example_inputs(batch, seq_len)
        return
    check_source(source, batch, seq_len)


def build_app_parser() -> argparse.ArgumentParser:
    """The options of ``fusion-explorer app`` (its own ``--help``, not Streamlit's)."""
    p = argparse.ArgumentParser(
        prog="fusion-explorer app",
        description="Start the Fusion Explorer app (Streamlit) on this machine; it makes no network request.",
        epilog="Open a model and view directly with a link such as "
               "http://localhost:8501/?model=residual_block&dtype=fp32&device=cpu&view=side "
               "(view: original, fused or side). Other options of 'streamlit run' (e.g. "
               "--server.maxUploadSize=500) are passed on as they are.")
    p.add_argument("--port", type=_positive, help="port to serve on (default 8501)")
    p.add_argument("--address", help="address to bind, e.g. 127.0.0.1 (default: Streamlit's)")
    p.add_argument("--headless", action="store_true", help="do not open a browser window")
    return p


def cmd_app(args: argparse.Namespace, extra: Sequence[str]) -> int:
    """``streamlit run explorer/app.py`` with this app's defaults and options; replaces this process."""
    from explorer.ui.files import MAX_UPLOAD_MB

    app = Path(__file__).with_name("app.py")
    # The repository's .streamlit/config.toml is read only from the working directory, so the
    # settings that matter are passed here too: the stated upload limit, no usage statistics
    # (the app never reaches the internet), and the static files (its CJK font). Later user arguments win.
    defaults = [f"--server.maxUploadSize={MAX_UPLOAD_MB}", "--browser.gatherUsageStats=false",
                "--server.enableStaticServing=true"]   # explorer/static/: the app's CJK font
    ours = ([f"--server.port={args.port}"] if getattr(args, "port", None) else []) + \
        ([f"--server.address={args.address}"] if getattr(args, "address", None) else []) + \
        (["--server.headless=true"] if getattr(args, "headless", False) else [])
    command = [sys.executable, "-m", "streamlit", "run", str(app), *defaults, *ours, *extra]
    os.execv(sys.executable, command)
    return 0  # not reached


#: The committed H200 report a CPU machine can use where a CUDA report is asked for (--reject-slower,
#: --separate-gpu-slower): ResNet-50 in fp16, channels_last, batch 32, measured on an NVIDIA H200.
H200_REPORT = "benchmarks/results/report_resnet50_fp16_channels_last_h200.json"

#: Examples shown by ``--help``, per subcommand (and all of them in the top-level help).
EXAMPLES: dict[str, list[tuple[str, str]]] = {
    "models": [("fusion-explorer models", "the zoo: name, family, input, description"),
               ("fusion-explorer models --json", "the same as one JSON list")],
    "detect": [("fusion-explorer detect resnet50", "chains, bytes and launches saved, near misses"),
               ("fusion-explorer detect bert_base --seq-len 128 --json", "one JSON object"),
               ("fusion-explorer detect model.onnx", "an ONNX file (or .pt2, or a Hugging Face folder)")],
    "plan": [("fusion-explorer plan resnet50 --accept conv_bn_act,conv_bn_add_act --out plan.json",
              "accept two patterns, write plan.json"),
             ("fusion-explorer plan resnet50 --reject conv_bn_act@conv2d --out plan.json", "reject one chain"),
             (f"fusion-explorer plan resnet50 --reject-slower {H200_REPORT} --out plan2.json",
              "drop the chains a report measured slower (on a CPU machine: the committed H200 report)"),
             ("fusion-explorer plan resnet50 --kernel conv_bn_act@conv2d_5=separate_epilogue --out plan3.json",
              "choose one chain's kernel"),
             (f"fusion-explorer plan resnet50 --memory-format channels_last --separate-gpu-slower {H200_REPORT} "
              "--out plan4.json", "separate epilogues where the fused kernel lost on the GPU")],
    "run": [("fusion-explorer run resnet50 --device cpu --quick --out quick.json",
             "a first look on a CPU: fewer repetitions, no per-chain timing"),
            ("fusion-explorer run resnet50 --plan plan.json --device cuda --dtype fp16 --batch 32 --out report.json",
             "the full measurement on a GPU"),
            ("fusion-explorer run residual_block --device cpu --baselines --out r.json",
             "also eager and torch.compile")],
    "sweep": [("fusion-explorer sweep sweep.toml --out benchmarks/results/sweeps/mine", "a grid from a file: docs/sweeps.md"),
              ("fusion-explorer sweep --models resnet50 --batches 1,8,32 --dtypes fp16 --out sweep1",
               "a grid from flags")],
    "compare-compile": [("fusion-explorer compare-compile residual_block --device cpu",
                         "our chains beside torch.compile's kernels"),
                        ("fusion-explorer compare-compile bert_base --device cuda --dtype fp16 --mode max-autotune "
                         "--json", "one JSON object")],
}


def _examples(*commands: str) -> str:
    """The "examples:" block of a help text: each command line, its purpose indented below it."""
    lines = ["examples:"]
    for command in commands:
        for line, what in EXAMPLES[command]:
            lines += [f"  {line}", f"      {what}"]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    raw = argparse.RawDescriptionHelpFormatter
    parser = OneLineParser(
        prog="fusion-explorer", formatter_class=raw,
        description="Find, choose and measure operator fusions in a model (a zoo name, .onnx, .pt2 or a\n"
                    "Hugging Face folder). Each command has its own --help. Every bad input prints one line\n"
                    "and exits with status 2.",
        epilog=_examples("models", "detect", "plan", "run", "compare-compile") + "\n\n"
               "A CPU machine cannot make the CUDA report that --reject-slower and --separate-gpu-slower read; "
               f"use the committed one:\n  {H200_REPORT}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help: str, description: str | None = None, epilog: str = "") -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=description or help[0].upper() + help[1:] + ".",
                              epilog=epilog or _examples(name), formatter_class=raw)

    p = add("models", "list the built-in zoo")
    p.add_argument("--json", action="store_true", help="print one JSON list")

    def model_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("model", help="zoo name, .onnx, .pt2 or Hugging Face folder")
        p.add_argument("--batch", type=_positive)
        p.add_argument("--seq-len", type=_positive, dest="seq_len")

    p = add("detect", "list the fusible chains and near misses of a model")
    model_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = add("plan", "write a fusion plan (JSON) to stdout, or to a file with --out",
            epilog=_examples("plan") + "\n\nOn a machine without a GPU, --reject-slower and --separate-gpu-slower "
                   f"read the committed H200 report:\n  {H200_REPORT}\n"
                   "--out writes the file only when the plan is made: a failure never leaves an empty file.")
    model_args(p)
    p.add_argument("--out", metavar="FILE", help="write the plan to FILE, only once it is made (default: stdout)")
    p.add_argument("--accept", default="all", help="all, none, or pattern names separated by commas")
    p.add_argument("--reject", default="", help="chain ids to reject, separated by commas")
    p.add_argument("--reject-slower", dest="reject_slower", metavar="REPORT",
                   help="also reject every chain that this run report measured slower fused")
    p.add_argument("--memory-format", default="nchw", metavar=_names(MEMORY_FORMATS), dest="memory_format",
                   help="the memory format the plan runs in (default nchw)")
    p.add_argument("--cuda-graphs", action="store_true", dest="cuda_graphs",
                   help="time the fused model as CUDA-graph replays (on a GPU)")
    p.add_argument("--kernel", action="append", metavar="ID=CHOICE",
                   help="kernel choice for one chain (auto, separate_epilogue, inductor: the pattern's list); "
                        "repeat for more chains")
    p.add_argument("--use", action="append", metavar="ALTERNATIVE",
                   help="accept an alternative (as 'fusion-explorer detect' lists it: 'conv_bn@conv2d_1 + elementwise_chain@add') "
                        "in place of the chain it competes with; repeat for more")
    p.add_argument("--separate-gpu-slower", dest="separate_gpu_slower", metavar="REPORT",
                   help="choose separate_epilogue for every conv/linear chain that this CUDA report measured "
                        "slower fused even as CUDA graphs (the fused kernel itself slower on the GPU)")

    p = add("run", "measure the fused against the unfused model")
    model_args(p)
    p.add_argument("--plan", help="plan.json (default: every chain accepted)")
    p.add_argument("--device", default="auto", metavar=_names(DEVICE_NAMES), help="the device (or cuda:N)")
    p.add_argument("--dtype", default="fp32", metavar=_names(DTYPE_NAMES))
    p.add_argument("--out", metavar="FILE", help="write the report to FILE, only once the run has succeeded "
                                                 "(default: stdout)")
    p.add_argument("--no-chains", action="store_true", dest="no_chains", help="skip per-chain timing")
    p.add_argument("--no-stages", action="store_true", dest="no_stages", help="skip the staged table")
    p.add_argument("--quick", action="store_true",
                   help="fewer repetitions and no per-chain timing (a first look in about a minute)")
    p.add_argument("--cpu-threads", type=_positive, dest="cpu_threads", metavar="N",
                   help="torch's intra-op threads for the run (default: torch's); 1 keeps a shared CPU's timings stable")
    p.add_argument("--baselines", action="store_true",
                   help="also time eager and torch.compile (default, and reduce-overhead on CUDA) in the same rounds")
    p.add_argument("--compile-modes", dest="compile_modes", default="", metavar="MODES",
                   help="torch.compile modes to compare with, separated by commas (implies --baselines): "
                        "default, reduce-overhead, max-autotune-no-cudagraphs")

    p = add("sweep", "measure many models x plans x shapes x dtypes, on one GPU or many")
    p.add_argument("sweep_file", nargs="?", help="a sweep file (.toml, .yaml): docs/sweeps.md; or use the flags")
    p.add_argument("--out", required=True, help="the sweep folder (results.jsonl, results.parquet, reports/)")
    p.add_argument("--models", help="zoo names or paths, separated by commas")
    p.add_argument("--plan", action="append", dest="plans", metavar="PLAN",
                   help="all, none, pattern[,pattern...] or a plan .json; repeat for more plans (default all)")
    p.add_argument("--batches", help="batch sizes, separated by commas (default 1)")
    p.add_argument("--seq-lens", dest="seq_lens", help="sequence lengths, for the models that take one")
    p.add_argument("--dtypes", help=", ".join(DTYPE_NAMES) + ", separated by commas (default fp32)")
    p.add_argument("--memory-formats", dest="memory_formats", help=", ".join(MEMORY_FORMATS) + " (default nchw)")
    p.add_argument("--cuda-graphs", dest="cuda_graphs_axis", metavar="on,off", help="CUDA graphs: on, off or on,off")
    p.add_argument("--baselines", dest="baselines_axis", metavar="on,off",
                   help="eager and torch.compile baselines: on, off or on,off")
    p.add_argument("--device", metavar=_names(DEVICE_NAMES))
    p.add_argument("--quick", action="store_true", help="fewer repetitions per point")
    p.add_argument("--per-chain", action="store_true", dest="per_chain", help="also time each chain alone")
    p.add_argument("--stages", action="store_true", help="also measure the staged table")
    p.add_argument("--timeout-s", type=float, dest="timeout_s", help="per point (default 900)")
    p.add_argument("--cpu-threads", type=_positive, dest="cpu_threads")
    p.add_argument("--warmup", type=int)
    p.add_argument("--reps", type=_positive)
    p.add_argument("--backend", choices=["local", "ray"], default="local",
                   help="local: one worker process per GPU (or one on the CPU); ray: one Ray actor per GPU")
    p.add_argument("--ray-address", dest="ray_address", help="join this Ray cluster (default: start a local Ray)")
    p.add_argument("--workers", type=_positive, help="workers on the CPU when there is no GPU (default 1)")
    p.add_argument("--force", action="store_true", help="measure again the points the folder holds already")
    p.add_argument("--allow-mixed-gpus", action="store_true", dest="allow_mixed_gpus",
                   help="let workers on different GPU models, drivers or versions share one sweep")
    p.add_argument("--workers-per-gpu", type=_positive, dest="workers_per_gpu",
                   help="workers taking turns on each GPU: one point's host work beside another's device work, "
                        "the device work one point at a time (default 1, or the sweep file's)")
    p.add_argument("--stop-after-s", type=_positive, dest="stop_after_s",
                   help="start no point that would end later than this many seconds after the start; the same "
                        "command resumes the rest")
    p = add("compare-compile", "our chains beside the kernels torch.compile generates")
    model_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--mode", default="default", choices=["default", "reduce-overhead", "max-autotune",
                                                          "max-autotune-no-cudagraphs"])
    p.add_argument("--device", default="auto", metavar=_names(DEVICE_NAMES), help="the device (or cuda:N)")
    p.add_argument("--dtype", default="fp32", metavar=_names(DTYPE_NAMES))
    p.add_argument("--timeout", type=_positive, default=900, help="seconds the compile may take (default 900)")

    sub.add_parser("app", help="start the Streamlit app (fusion-explorer app --help for its options)",
                   add_help=False)
    return parser


def _names(names: Sequence[str]) -> str:
    return "{" + ",".join(names) + "}"


def _check_target_names(args: argparse.Namespace) -> None:
    """A dtype, device or memory format outside the vocabulary (``explorer.vocab``): one line, before any work."""
    for name, parse in (("device", parse_device), ("dtype", parse_dtype), ("memory_format", parse_memory_format)):
        value = getattr(args, name, None)
        if value is not None:
            parse(value)
    for value in _csv(getattr(args, "dtypes", None) or "", what="dtypes"):
        parse_dtype(value)
    for value in _csv(getattr(args, "memory_formats", None) or "", what="memory-formats"):
        parse_memory_format(value)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if argv and argv[0] == "app":   # its own options (and --help); the rest go to streamlit
        args, extra = build_app_parser().parse_known_args(argv[1:])
        return cmd_app(args, extra)
    args = parser.parse_args(argv)
    handlers = {"models": cmd_models, "detect": cmd_detect, "plan": cmd_plan, "run": cmd_run, "sweep": cmd_sweep,
                "compare-compile": cmd_compare_compile}
    try:
        _check_target_names(args)
        return handlers[args.command](args)
    except ExplorerError as exc:
        print(f"fusion-explorer: error: {clean(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("fusion-explorer: interrupted", file=sys.stderr)
        return 130
    except MemoryError:
        print("fusion-explorer: error: out of memory", file=sys.stderr)
        return EXIT_USAGE
    except (Exception, RecursionError) as exc:  # last resort: one line, never a traceback
        first = " ".join(str(exc).split())[:300]
        print(f"fusion-explorer: unexpected error: {type(exc).__name__}: {clean(first)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

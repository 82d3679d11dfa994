"""Running Triton kernels: where they can run, and launching them cheaply.

Nothing here imports Triton until a Triton kernel is actually needed, so the
package imports on a machine without a GPU and without Triton. On the CPU the
kernels run only under ``TRITON_INTERPRET=1`` (Triton's interpreter, used by
the tests on machines without a GPU).

Kernel modules define their ``@triton.jit`` functions inside a builder cached
per interpreter mode (``triton.jit`` reads ``TRITON_INTERPRET`` when it
decorates), and bind the Triton names the kernels use (``tl`` and helper
``@triton.jit`` combine functions) as module globals: Triton resolves a
kernel's names through its module's globals, and not every Triton version
resolves closure variables.
"""

from __future__ import annotations

import functools
import os
import types
from typing import Any, Callable

import torch

from explorer.fusions.base import WORDS


def interpreting() -> bool:
    """True when ``TRITON_INTERPRET=1``: Triton kernels run on the CPU, in numpy."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    """True when ``import triton`` works (cached; the import is done only once)."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # ImportError, or a broken install raising at import
        return False
    return True


def triton_runs_on(device: torch.device | str) -> bool:
    """Whether a Triton kernel can run on tensors of ``device`` in this process.

    CUDA tensors: when Triton imports. CPU tensors: only under
    ``TRITON_INTERPRET=1`` (the interpreter used by the tests on machines
    without a GPU).
    """
    device = torch.device(device)
    if device.type == "cuda":
        return not interpreting() and triton_available()
    if device.type == "cpu":
        return interpreting() and triton_available()
    return False


def import_triton():
    """``(triton, triton.language)``, imported on demand."""
    import triton
    import triton.language as tl
    return triton, tl


def library_reductions_usable() -> bool:
    """Whether kernels may call Triton's library reductions (``tl.sum``, ``tl.max``).

    Always when compiling. When interpreting, only if Triton was first imported with
    ``TRITON_INTERPRET=1`` (it decorates its library functions at import); otherwise the
    kernels fall back to ``tl.reduce`` with their own combine function, which the
    interpreter runs correctly but slowly.
    """
    if not interpreting():
        return True
    try:
        import triton.language as tl
        from triton.runtime.interpreter import InterpretedFunction
    except Exception:
        return False
    return isinstance(tl.sum, InterpretedFunction)


def refusal_for_device(device: torch.device | str) -> str | None:
    """Why a Triton kernel cannot run on tensors of ``device`` in this process (None: it can).

    The same answer as ``triton_runs_on``, as a sentence for a kernel selection's label.
    """
    device = torch.device(device)
    if device.type == "cuda":
        if interpreting():
            return WORDS("interpret_cuda")
        return None if triton_available() else WORDS("triton_import")
    if device.type == "cpu":
        if not interpreting():
            return WORDS("no_triton_interpret", device="cpu")
        return None if triton_available() else WORDS("triton_import")
    return WORDS("no_backend", device=device.type)


def no_triton(device: torch.device) -> str:
    """Why a kernel selection takes its reference where Triton does not run: "no Triton on cpu ..."."""
    return WORDS("no_triton_interpret" if device.type == "cpu" else "no_triton", device=device.type)


def where(label: str, device: torch.device) -> str:
    """``label``, marked "[Triton interpreter on cpu]" where a Triton kernel is interpreted on the CPU."""
    return WORDS("interpreted", label=label) if device.type == "cpu" else label


def needs_autograd(*tensors: torch.Tensor | None) -> bool:
    """True when autograd would record an op on these operands. The Triton kernels are forward-only
    (no backward), so such calls take their reference ops, which autograd differentiates."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= ``n`` (1 for n <= 1)."""
    return 1 << max(int(n) - 1, 0).bit_length()


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers."""
    return (a + b - 1) // b


def row_warps(elements: int) -> int:
    """``num_warps`` for a program holding ``elements`` elements of rows (a power of two): enough warps
    that each thread holds a few 16-byte vectors (the row-wise norms' heuristic)."""
    if elements >= 8192:
        return 16
    if elements >= 2048:
        return 8
    if elements >= 512:
        return 4
    return 2 if elements >= 128 else 1


@functools.lru_cache(maxsize=2)
def jit_helpers(interpret: bool) -> types.SimpleNamespace:
    """Triton device functions kernels share, defined on first use and cached per interpreter mode.

    ``round_to(v, DTYPE, BF16_RTNE_BY_HAND)``: fp32 ``v`` rounded to nearest even in ``DTYPE``.
    Compiled kernels round to nearest even already; Triton's interpreter casts fp32 to bf16 by
    truncation, so under the interpreter (``BF16_RTNE_BY_HAND``) the bits are rounded by hand
    first (add 0x7FFF plus the lowest kept bit, clear the low half), after which the truncating
    cast is exact. ``add(a, b)``: the combine function of ``tl.reduce`` where ``tl.sum`` cannot
    be interpreted (``library_reductions_usable``).

    A kernel module binds these to its own module globals before decorating its kernels: Triton
    resolves the names a kernel calls through the kernel's module globals.
    """
    global tl  # the interpreter looks triton.language up in a device function's globals
    del interpret  # part of the cache key only: triton.jit reads TRITON_INTERPRET when it decorates
    triton, tl = import_triton()

    @triton.jit
    def round_to(v, DTYPE: tl.constexpr, BF16_RTNE_BY_HAND: tl.constexpr):
        """fp32 ``v`` rounded to nearest even in ``DTYPE`` (see ``jit_helpers``)."""
        if BF16_RTNE_BY_HAND:
            if DTYPE == tl.bfloat16:
                bits = v.to(tl.uint32, bitcast=True)
                v = ((bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16 << 16).to(tl.float32, bitcast=True)
        return v.to(DTYPE, fp_downcast_rounding="rtne")

    @triton.jit
    def add(a, b):
        """``a + b``: the combine function of ``tl.reduce``."""
        return a + b

    return types.SimpleNamespace(round_to=round_to, add=add)


# ------------------------------------------------------------------ planning launches

class Launch:
    """One call signature's launch, worked out once (see ``planned``): the kernel (None: the call runs
    its reference instead), its grid, the integer arguments, the constexprs and the warps, and where the
    family plans it, the output a call allocates (``out_dtype``, ``out_shape``)."""

    __slots__ = ("kernel", "grid", "ints", "constexprs", "num_warps", "out_dtype", "out_shape")

    def __init__(self, kernel=None, grid=(), ints=(), constexprs=None, num_warps=0, out_dtype=None,
                 out_shape=()) -> None:
        self.kernel, self.grid, self.ints, self.constexprs = kernel, grid, ints, constexprs
        self.num_warps, self.out_dtype, self.out_shape = num_warps, out_dtype, out_shape


#: How many plans a family keeps (``remember``): a process that sees ever new call signatures plans
#: again for the oldest instead of growing without end.
MAX_PLANS = 1024


def remember(plans: dict, key: Any, plan: Any) -> Any:
    """Keep ``plan`` under ``key`` in a family's plan cache, dropping the oldest beyond ``MAX_PLANS``;
    returns ``plan``."""
    plans[key] = plan
    if len(plans) > MAX_PLANS:
        del plans[next(iter(plans))]
    return plan


def planned(plans: dict, key: Any, make: Callable[..., Any], *args: Any) -> Any:
    """The plan kept under ``key``, or ``make(*args)`` kept there first (``remember``).

    A family plans a call signature once (its decisions, grid and launch arguments) so that a model's
    repeated calls cost the host little more than the allocations and the launch itself.
    """
    plan = plans.get(key)
    if plan is None:
        plan = remember(plans, key, make(*args))
    return plan


def operand_key(t: torch.Tensor | None) -> tuple | None:
    """What a plan depends on for one operand (None for none): shape, strides, dtype, device and
    whether its pointer is 16-byte aligned (Triton specialises on that)."""
    if t is None:
        return None
    return (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15 == 0)


def contiguous_key(*tensors: torch.Tensor | None) -> tuple | None:
    """``operand_key`` without the strides, for a fast path that takes contiguous operands only
    (the shape then fixes the strides); None where one of them is not contiguous."""
    out = []
    for t in tensors:
        if t is None:
            out.append(None)
        elif not t.is_contiguous():
            return None
        else:
            out.append((t.dtype, t.shape, t.device, t.data_ptr() & 15 == 0))
    return tuple(out)


# ------------------------------------------------------------------ launching

class _Compiled:
    """One kernel compiled for one specialisation: its bound launcher (``direct``) or a runner per grid."""

    __slots__ = ("handle", "const_values", "runners", "direct")

    def __init__(self, handle: Any, const_values: tuple) -> None:
        self.handle = handle                  # triton.compiler.CompiledKernel
        self.const_values = const_values      # constexpr values, in parameter order
        self.runners: dict[tuple, Any] = {}   # grid -> the handle's launcher for that grid
        self.direct = bind_launcher(handle)   # (grid, stream, args) -> None, or None: use the runners

    def runner(self, grid: tuple) -> Any:
        """Triton's own runner of this handle for ``grid`` (kept per grid; the handle wants 3 grid dims)."""
        runner = self.runners.get(("runner", grid))
        if runner is None:
            runner = self.runners[("runner", grid)] = self.handle[tuple(grid) + (1,) * (3 - len(grid))]
        return runner


#: The Triton versions whose launcher ``bind_launcher`` knows how to call directly (``major.minor``).
#: Each is checked on a GPU against the runner it bypasses (``tests/test_gpu_launch.py``); on any other
#: version every launch takes Triton's own runner, as before.
DIRECT_LAUNCH_VERSIONS = ("3.6",)


def _triton_minor() -> str:
    import triton
    return ".".join(triton.__version__.split(".")[:2])


def bind_launcher(handle: Any) -> Callable[[tuple, int, tuple], None] | None:
    """Bind a compiled kernel's C launcher once, so that a launch is one call with the grid, stream and arguments.

    What ``CompiledKernel[grid](*args)`` does at every call, through two Python frames and two closures
    defined anew each time: read the launch hooks, build launch metadata for them, allocate the global and
    profile scratch buffers the kernel declares, then call the generated C ``launch`` with the function
    handle, the cooperative-grid and PDL flags, the packed metadata and the arguments. For a kernel that
    declares no scratch, run while no launch hook is set, all of that but the C call is the same at every
    launch, so it is done here once. Returns None (callers keep the runner) on a Triton version not in
    ``DIRECT_LAUNCH_VERSIONS``, for a kernel with scratch, or where the launcher is not the shape known.
    Hooks set later (a profiler such as Proton) are honoured: ``launch`` checks them at every call.
    """
    try:
        if _triton_minor() not in DIRECT_LAUNCH_VERSIONS:
            return None
        handle._init_handles()
        run = handle.run
        if type(run).__name__ != "CudaLauncher" or getattr(run, "gsan_enabled", False):
            return None
        if run.global_scratch_size or run.profile_scratch_size:
            return None
        c_launch, function, metadata = run.launch, handle.function, handle.packed_metadata
        coop, pdl = run.launch_cooperative_grid, run.launch_pdl
    except Exception:  # anything unexpected in Triton's internals: keep its own path
        return None

    def direct(grid: tuple, stream: int, args: tuple) -> None:
        # Triton 3.6's CudaLauncher.__call__ with no scratch and no hooks: global and profile scratch
        # None, then the runner's (packed metadata, launch metadata, enter hook, exit hook, *args).
        c_launch(grid[0], grid[1], grid[2], stream, function, coop, pdl, None, None,
                 metadata, None, None, None, *args)

    return direct


@functools.lru_cache(maxsize=1)
def _runtime_knobs() -> Any:
    from triton import knobs
    return knobs.runtime


def _hook_active(hook: Any) -> bool:
    # Triton 3.6 keeps an empty ``HookChain`` installed by default: it is a hook only once something is added.
    return hook is not None and (not hasattr(hook, "calls") or bool(hook.calls))


def _hooks_set() -> bool:
    """Whether a launch hook is installed (a profiler such as Proton): then every launch takes the runner."""
    knobs = _runtime_knobs()
    return _hook_active(knobs.launch_enter_hook) or _hook_active(knobs.launch_exit_hook)


#: Each kernel's compiled specialisations, by launch signature and device, kept on the kernel object
#: itself (``_explorer_compiled``) so that finding one hashes the signature only, never the kernel
#: (a ``JITFunction`` hashes its source key). Bounded per kernel: a process that sees ever new shapes
#: recompiles the oldest instead of growing without end. ``_CACHES`` lists them for ``compiled_entries``.
_CACHES: list[dict] = []
MAX_COMPILED = 256


def _new_cache(kernel: Any) -> dict:
    cache: dict = {}
    kernel._explorer_compiled = cache
    _CACHES.append(cache)
    return cache


def compiled_entries() -> list[_Compiled]:
    """Every compiled specialisation ``launch`` keeps (all kernels)."""
    return [entry for cache in _CACHES for entry in cache.values()]


def clear_compiled() -> None:
    """Forget every compiled specialisation: the next launch of each goes through the JIT again."""
    for cache in _CACHES:
        cache.clear()


def _specialization(arg: Any) -> tuple:
    """What Triton specialises a kernel on, for one argument (a superset, to be safe).

    Tensors: dtype and 16-byte alignment of the pointer. Integers: equal to 1, divisible
    by 16, and which integer width holds them. Anything else: its type (and value for
    the rare non-numeric ones).
    """
    if isinstance(arg, torch.Tensor):
        return ("t", arg.dtype, arg.data_ptr() % 16 == 0)
    if isinstance(arg, bool):
        return ("b", arg)
    if isinstance(arg, int):
        return ("i", arg == 1, arg % 16 == 0, -(1 << 31) <= arg < (1 << 31), arg < (1 << 63))
    if isinstance(arg, float):
        return ("f",)
    return ("o", type(arg).__name__, arg)


def launch(kernel: Any, grid: tuple, args: tuple, constexprs: dict[str, Any], key: Any = None,
           **options: Any) -> None:
    """``kernel[grid](*args, **constexprs, **options)``, without the JIT's per-call cost after the first.

    Triton's JIT binds and specialises every argument on every call: one Add+LayerNorm call
    through it cost several times the eager add + layer_norm pair in host time, and far less with
    this path and the planned call of ``add_layernorm`` (measured in
    ``benchmarks/results/host_overhead_h200.json`` and ``host_overhead_fastpath_h200.json``). The first
    call for a signature goes through the JIT, which compiles and returns the compiled
    kernel; later calls with the same signature launch that handle directly, on the current
    stream of the first tensor's device: through its C launcher bound once (``bind_launcher``)
    where the Triton version allows, else through Triton's runner kept per grid.

    ``args`` are the kernel's runtime arguments in order; its constexpr parameters must
    all come after them. ``key``, when given, must determine everything Triton
    specialises on (dtypes, 16-byte pointer alignment, integers equal to 1 or divisible
    by 16) and the constexprs and options: a family passes its ``Launch`` plan itself, made once per
    call signature with exactly these, so the compiled handle kept for it can never be another plan's
    (a key built from the call's operands alone missed the constexprs a module setting picks: the
    SwiGLU kernel then ran with one plan's tiles and another's grid). Hashing a plan costs nothing,
    which is much cheaper than ``_specialization`` of every argument (the default).
    Under the interpreter, or on a tensor not on CUDA, always the plain call.
    """
    if _RECORDING is not None and not _RECORDING.paused:
        _launch_recorded(kernel, grid, args, constexprs, key, options)
        return
    first = args[0]
    if not first.is_cuda:
        kernel[grid](*args, **constexprs, **options)
        return
    if key is None:
        key = _default_key(args, constexprs, options)
    device = first.get_device()
    cache = getattr(kernel, "_explorer_compiled", None)
    if cache is None:
        cache = _new_cache(kernel)
    key = (key, device)
    hit = cache.get(key)
    if hit is None:
        compiled = kernel[grid](*args, **constexprs, **options)
        if interpreting():  # an interpreted kernel has no compiled handle to keep
            return
        if compiled is not None and hasattr(compiled, "__getitem__"):
            names = list(kernel.arg_names)[len(args):]
            if len(cache) >= MAX_COMPILED:
                cache.pop(next(iter(cache)))  # the oldest specialisation
            cache[key] = _Compiled(compiled, tuple(constexprs[n] for n in names))
        return
    stream = torch._C._cuda_getCurrentRawStream(device)
    if hit.direct is not None and not _hooks_set():
        grid3 = hit.runners.get(grid)
        if grid3 is None:
            grid3 = hit.runners[grid] = tuple(grid) + (1,) * (3 - len(grid))
        hit.direct(grid3, stream, (*args, *hit.const_values))
        return
    hit.runner(grid)(*args, *hit.const_values, stream=stream)


def _default_key(args: tuple, constexprs: dict[str, Any], options: dict[str, Any]) -> tuple:
    """``launch``'s signature key where the caller gives none: everything Triton specialises on."""
    return (tuple(constexprs.items()), tuple(sorted(options.items())), tuple(_specialization(a) for a in args))


def _launch_recorded(kernel: Any, grid: tuple, args: tuple, constexprs: dict[str, Any], key: Any,
                     options: dict[str, Any]) -> None:
    """``launch`` while a ``BoundCall`` records: the launch as always (the JIT's and the interpreter's own tensor
    ops not recorded), then the launch and the compiled specialisation it used noted in ``_RECORDING``."""
    recording = _RECORDING
    recording.paused = True
    try:
        launch(kernel, grid, args, constexprs, key, **options)
    finally:
        recording.paused = False
    entry = None
    first = args[0]
    if first.is_cuda and not interpreting():
        cache = getattr(kernel, "_explorer_compiled", None)
        full = (key if key is not None else _default_key(args, constexprs, options), first.get_device())
        entry = None if cache is None else cache.get(full)
    recording.launches.append((kernel, tuple(grid), tuple(args), dict(constexprs), dict(options), entry))


# ------------------------------------------------------------------ bound calls (one graph node, one plan)

class _Recording:
    """What one call of a fused target did, seen while ``BoundCall`` records it: the launches (through ``launch``),
    the tensors it allocated, and the first tensor op that is neither an allocation nor a view (``computed``)."""

    __slots__ = ("launches", "allocs", "computed", "paused")

    def __init__(self) -> None:
        self.launches: list[tuple] = []
        self.allocs: list[torch.Tensor] = []
        self.computed: str | None = None
        self.paused = False


#: The recording in progress (``BoundCall``'s first call), else None: ``launch`` notes its launches there.
_RECORDING: _Recording | None = None

#: ATen ops a recorded call may run without losing its replay: allocations (replayed) and views (metadata only,
#: the kernels read through the pointers recorded). Anything else computes, so the call keeps its generic path.
_ALLOCATING = ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided")
_VIEWING = ("view", "_unsafe_view", "reshape", "transpose", "permute", "expand", "slice", "select", "split",
            "split_with_sizes", "unsqueeze", "squeeze", "as_strided", "t", "alias", "detach", "unbind", "narrow",
            "chunk", "unflatten", "flatten", "view_as", "expand_as", "sym_size", "sym_stride", "sym_numel",
            "sym_storage_offset", "is_contiguous", "lift_fresh")


def _metadata_only(func: Any, out: Any) -> bool:
    """An op that returns no tensor and writes none (``promote_types``, ``result_type``): a question, not work."""
    schema = getattr(func, "_schema", None)
    flat = out if isinstance(out, (tuple, list)) else (out,)
    return schema is not None and not schema.is_mutable and not any(isinstance(o, torch.Tensor) for o in flat)


def _recorder_mode():
    """A ``TorchDispatchMode`` that notes allocations and the first computing op into ``_RECORDING``."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            rec = _RECORDING
            if rec is not None and not rec.paused:
                name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
                if name in _ALLOCATING and isinstance(out, torch.Tensor):
                    rec.allocs.append(out)
                elif name not in _VIEWING and rec.computed is None and not _metadata_only(func, out):
                    rec.computed = name
            return out

    return _Mode()


def _storage_key(t: torch.Tensor) -> tuple:
    return (t.device, t.untyped_storage().data_ptr())


def _buffer_maker(shape: tuple, stride: tuple, dtype: torch.dtype, device: torch.device,
                  contiguous: bool) -> Callable[[], torch.Tensor]:
    """What makes a replayed call's allocation, as the recorded one: ``torch.empty`` bound to its arguments (a C
    call per replay, no Python frame). Tests replace this to poison the allocations."""
    if contiguous:
        return functools.partial(torch.empty, shape, dtype=dtype, device=device)
    return functools.partial(torch.empty_strided, shape, stride, dtype=dtype, device=device)


class _Replay:
    """A recorded call replayed: check the inputs, allocate the outputs, launch each kernel once.

    Built from the first call's tensors (``build``); ``run`` returns None where an input differs from the
    recorded one in what the launches depend on (shape, strides, dtype, device, a pointer's 16-byte alignment
    where it was aligned, autograd), or a launch hook is set: the caller then takes the generic path.
    """

    __slots__ = ("checks", "positions", "allocs", "launches", "aligned_inputs", "outputs", "single", "device",
                 "compiled", "hooks")

    @classmethod
    def build(cls, args: tuple, rec: _Recording, out: Any) -> "_Replay | str":
        """The replay of ``rec`` (one call on ``args`` returning ``out``), or why the call cannot be replayed."""
        if rec.computed is not None:
            return f"runs {rec.computed} besides its kernels"
        if not rec.launches:
            return "launches no Triton kernel"
        tensors = [(i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        self = cls()
        self.device = tensors[0][1].device
        self.compiled = self.device.type == "cuda"
        if any(t.device != self.device for _, t in tensors):
            return "reads tensors of two devices"
        self.checks = tuple((i, t.shape, t.stride(), t.dtype) for i, t in tensors)
        self.positions = tuple(i for i, _ in tensors)
        by_storage: dict[tuple, list[int]] = {}
        for slot, (i, t) in enumerate(tensors):
            by_storage.setdefault(_storage_key(t), []).append(slot)
        allocs, alloc_index = [], {}
        for a in rec.allocs:
            alloc_index.setdefault(_storage_key(a), len(allocs))
            if len(allocs) < len(alloc_index):
                allocs.append(a)

        def source(t: torch.Tensor) -> tuple | str:
            """``("in", slot, byte offset)`` or ``("new", alloc, byte offset)`` of a tensor a kernel reads."""
            key = _storage_key(t)
            slots = by_storage.get(key)
            if slots:
                exact = [s for s in slots if tensors[s][1].data_ptr() == t.data_ptr()]
                if len(slots) == 1:
                    return ("in", slots[0], t.data_ptr() - tensors[slots[0]][1].data_ptr())
                if len(exact) == 1:
                    return ("in", exact[0], 0)
                return "reads a view shared by two inputs"
            if key in alloc_index:
                j = alloc_index[key]
                return ("new", j, t.data_ptr() - allocs[j].data_ptr())
            return "reads a tensor made outside the call"

        launches, aligned_inputs, used = [], set(), set()
        for kernel, grid, largs, constexprs, options, entry in rec.launches:
            if self.compiled and entry is None:
                return "a kernel without a kept compiled handle"
            template = list(largs) + (list(entry.const_values) if self.compiled else [])
            slots = []
            for pos, a in enumerate(largs):
                if not isinstance(a, torch.Tensor):
                    continue
                src = source(a)
                if isinstance(src, str):
                    return src
                kind, idx, off = src
                base = tensors[idx][1] if kind == "in" else allocs[idx]
                if a.dtype != base.dtype or off % a.element_size():
                    return "reads a tensor as another dtype"
                aligned = a.data_ptr() % 16 == 0
                if kind == "in" and aligned:
                    aligned_inputs.add((idx, off))
                if kind == "new":
                    used.add(idx)
                # the interpreter reads tensors: their view of the base, as (size, stride, element offset)
                slots.append((pos, kind == "in", idx, off, tuple(a.shape), tuple(a.stride()), off // a.element_size()))
                template[pos] = None
            grid3 = tuple(grid) + (1,) * (3 - len(grid))
            launches.append((entry, grid3, template, tuple(slots), kernel, grid, constexprs, options))
        outputs = []
        flat = list(out) if isinstance(out, (tuple, list)) else [out]
        for o in flat:
            if o is None:
                outputs.append(None)
                continue
            if not isinstance(o, torch.Tensor):
                return "returns something other than tensors"
            same = [s for s, (_, t) in enumerate(tensors) if t is o]
            if same:
                outputs.append(("in", same[0]))
                continue
            key = _storage_key(o)
            if key not in alloc_index:
                return "returns a view of an input or of a tensor made elsewhere"
            j = alloc_index[key]
            used.add(j)
            whole = (o.shape == allocs[j].shape and o.stride() == allocs[j].stride()
                     and o.storage_offset() == allocs[j].storage_offset())
            outputs.append(("new", j) if whole else ("view", j, tuple(o.shape), tuple(o.stride()),
                                                     o.storage_offset()))
        if any(a.storage_offset() for a in allocs):
            return "allocates a view"
        # ``torch.empty`` only where it makes the recorded strides: a size-1 dim's stride is free in a contiguous
        # tensor (``empty_like`` of a ``(1, T, C)`` transpose keeps ``(C, C, 1)``, ``torch.empty`` gives
        # ``(T·C, C, 1)``), and a replayed output with other strides than the recorded one fails the input check of
        # the next bound call at every forward (vit_b_32 at batch 1: 12 of its 25 add+LayerNorm calls)
        self.allocs = tuple(_buffer_maker(tuple(a.shape), tuple(a.stride()), a.dtype, a.device,
                                          a.stride() == torch.empty(a.shape, device="meta").stride())
                            if j in used else None for j, a in enumerate(allocs))
        self.launches = tuple(launches)
        self.aligned_inputs = tuple(sorted(aligned_inputs))
        self.outputs = tuple(outputs)
        self.single = not isinstance(out, (tuple, list))
        self.hooks = _runtime_knobs() if self.compiled else None
        return self

    def run(self, args: tuple) -> Any:
        """The outputs of one replayed call on ``args``; None where the generic path must run instead."""
        device = self.device
        tensors, bases = [], []
        for i, shape, stride, dtype in self.checks:
            t = args[i]
            if t.dtype != dtype or t.shape != shape or t.stride() != stride or t.device != device:
                return None
            tensors.append(t)
            bases.append(t.data_ptr())
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return None                                   # the generic path takes the reference, which autograd records
        if self.compiled:
            enter, exit_ = self.hooks.launch_enter_hook, self.hooks.launch_exit_hook   # ``_hook_active``, inline
            if (enter is not None and getattr(enter, "calls", True)) or (exit_ is not None
                                                                         and getattr(exit_, "calls", True)):
                return None                               # a profiler's hook: Triton's runner calls it
        for idx, off in self.aligned_inputs:
            if (bases[idx] + off) & 15:
                return None                               # compiled for an aligned pointer: the JIT picks another
        allocs, news = [], []
        for make in self.allocs:
            a = None if make is None else make()
            allocs.append(a)
            news.append(0 if a is None else a.data_ptr())
        if self.compiled:
            stream = torch._C._cuda_getCurrentRawStream(device.index)
            for entry, grid3, template, slots, _, _, _, _ in self.launches:
                largs = list(template)
                for pos, from_input, idx, off, _, _, _ in slots:
                    largs[pos] = (bases[idx] if from_input else news[idx]) + off
                if entry.direct is not None:
                    entry.direct(grid3, stream, largs)
                else:
                    entry.runner(grid3)(*largs, stream=stream)
        else:                                             # the interpreter: tensors, through the plain JIT call
            for _, _, template, slots, kernel, grid, constexprs, options in self.launches:
                largs = list(template)
                for pos, from_input, idx, _, size, stride, elems in slots:
                    base = tensors[idx] if from_input else allocs[idx]
                    largs[pos] = torch.as_strided(base, size, stride, base.storage_offset() + elems)
                kernel[grid](*largs, **constexprs, **options)
        outs = []
        for spec in self.outputs:
            if spec is None:
                outs.append(None)
            elif spec[0] == "in":
                outs.append(tensors[spec[1]])
            elif spec[0] == "new":
                outs.append(allocs[spec[1]])
            else:
                outs.append(torch.as_strided(allocs[spec[1]], spec[2], spec[3], spec[4]))
        return outs[0] if self.single else tuple(outs)

    def mismatch(self, args: tuple) -> str | None:
        """Why ``run`` would take the generic path on ``args``, in words (None: it would replay). The same checks
        as ``run``'s, in its order, for an audit (``lean.audit_bound_calls``): ``run`` itself never calls this."""
        tensors = []
        for i, shape, stride, dtype in self.checks:
            t = args[i]
            if not isinstance(t, torch.Tensor):
                return f"argument {i} is a {type(t).__name__}, recorded a tensor"
            if t.dtype != dtype:
                return f"argument {i} has dtype {t.dtype}, recorded {dtype}"
            if t.shape != shape:
                return f"argument {i} has shape {tuple(t.shape)}, recorded {tuple(shape)}"
            if t.stride() != stride:
                return f"argument {i} {tuple(t.shape)} has strides {t.stride()}, recorded {stride}"
            if t.device != self.device:
                return f"argument {i} is on {t.device}, recorded on {self.device}"
            tensors.append(t)
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return "autograd records the call (an input requires grad)"
        if self.compiled:
            enter, exit_ = self.hooks.launch_enter_hook, self.hooks.launch_exit_hook
            if (enter is not None and getattr(enter, "calls", True)) or (exit_ is not None
                                                                         and getattr(exit_, "calls", True)):
                return "a launch hook is set (a profiler)"
        for idx, off in self.aligned_inputs:
            if (tensors[idx].data_ptr() + off) & 15:
                return f"argument {self.checks[idx][0]} (+{off} bytes) is not 16-byte aligned, recorded aligned"
        return None


class BoundCall:
    """One graph node's fused call, planned once: after its first call, allocate the outputs and launch.

    ``generic`` is a fused call target whose work is Triton launches through ``launch`` (a family's kernel
    call: the rotary QKV GEMM, the GEMM with a residual, the SwiGLU epilogues, RMSNorm ...). The first call
    runs it as always (it plans, compiles, keeps the compiled handle) while it is recorded: which kernels it
    launched with which arguments, which tensors it allocated, which tensors it returned, and that it ran no
    other tensor op (a view or an allocation only: a ``TorchDispatchMode`` sees every op). Later calls replay
    that: check each input tensor's shape, strides, dtype and device against the recorded ones (and the
    16-byte alignment of pointers that were aligned, the one pointer property Triton specialises on), allocate
    the outputs, launch each kernel through its bound C launcher (``bind_launcher``) with pointers and the
    recorded integers: no selection, no plan lookup, no key, no environment read, no string. Any difference
    takes the generic path for that call (which plans and compiles as it always did); so does a call autograd
    would record, a launch hook (a profiler), or a first call that did anything the replay cannot repeat
    (``why`` says what). ``declined`` counts the calls whose replay declined (``_Replay.mismatch`` says why):
    a node whose replay declines at every call pays the generic path as if it never bound.

    The graph's constant arguments (ints, floats, None) are the node's, the same at every call; keyword
    arguments take the generic path. Under the interpreter (CPU tensors with ``TRITON_INTERPRET=1``) the
    replay is the same, the kernels called through the JIT with views of the same memory: the CPU tests run
    this very object. A copy (``copy.deepcopy`` of a graph) starts unrecorded.
    """

    def __init__(self, generic: Callable[..., Any]) -> None:
        self.generic = generic
        self.__name__ = self.__qualname__ = getattr(generic, "__name__", "call")
        self.__module__ = getattr(generic, "__module__", __name__)
        self.replay: _Replay | None = None
        self.recorded = False                             # the first eligible call was recorded
        self.why: str | None = None                       # why it stays on the generic path (None: bound, or not yet)
        self.declined = 0                                 # calls the replay declined (took the generic path)

    def __repr__(self) -> str:
        state = "bound" if self.replay is not None else f"generic: {self.why}" if self.why else "not yet called"
        return f"BoundCall({self.__name__}, {state})"

    def __deepcopy__(self, memo) -> "BoundCall":
        return BoundCall(self.generic)

    def __reduce__(self):
        return (BoundCall, (self.generic,))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        replay = self.replay
        if replay is not None and not kwargs:
            try:
                out = replay.run(args)
            except Exception as exc:  # a launcher that refuses what the replay passes: this node stays generic
                self.replay, self.why = None, f"replay failed: {type(exc).__name__}: {exc}"[:200]
                return self.generic(*args)
            if out is not None:
                return out
            self.declined += 1                            # (``_Replay.mismatch`` says why, for an audit)
            return self.generic(*args)
        if self.recorded or kwargs:
            return self.generic(*args, **kwargs)
        return self._record(args)

    def _record(self, args: tuple) -> Any:
        """Run the generic target once while recording it; keep the replay where it can be made."""
        global _RECORDING
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        nested = any(isinstance(a, (tuple, list)) and any(isinstance(b, torch.Tensor) for b in a) for a in args)
        if not tensors or nested or not triton_runs_on(tensors[0].device) or _RECORDING is not None:
            self.recorded, self.why = True, "not a call on tensors Triton runs on" if not _RECORDING else "nested"
            return self.generic(*args)
        if (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)) or (
                tensors[0].is_cuda and torch.cuda.is_current_stream_capturing()):
            return self.generic(*args)                    # recorded later, outside autograd and CUDA-graph capture
        rec = _Recording()
        _RECORDING = rec
        try:
            with _recorder_mode():
                out = self.generic(*args)
        finally:
            _RECORDING = None
        self.recorded = True
        replay = _Replay.build(args, rec, out)
        if isinstance(replay, str):
            self.why = replay
        else:
            self.replay = replay
        return out

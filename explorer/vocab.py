"""The vocabularies: the op *kinds* every pattern is written against, and the names of a run's target.

Pure data, no torch: the matcher, the plans and the views read it without
pulling in the graph layer. ``explorer.graph.aten.kind_of`` maps an fx node
(from ``torch.export`` or the ONNX importer) onto these kinds; patterns speak
only of kinds (``conv``, ``batch_norm``, ``relu``, ``add``, ``matmul``,
``linear``, ``softmax``, ``layer_norm``, ...), never of raw ATen names.

Some kinds are *transparent*: views, tuple unpacking and inference-mode
dropout launch no kernel and move no bytes. Patterns look through them.

The other vocabulary names what a fused model is made for: ``Target(device, dtype,
memory_format)``, with the one list of dtype names (``DTYPE_NAMES``: fp32, fp16, bf16),
device names (``DEVICE_NAMES``: auto, cpu, cuda, or ``cuda:N``) and memory formats
(``MEMORY_FORMATS``: nchw, the contiguous layout, and channels_last). The command line, the
app's settings, a sweep's spec, a plan and the runner parse these names here, so a bad
value is refused in the parent process with one line before any child starts
(``TargetError``); ``fusion_engine.fuse`` takes a ``Target`` and each chain's kernel
choice is made once for it (``explorer.fusions.rewrite``).
"""

from __future__ import annotations

import dataclasses
import re

from explorer.errors import ExplorerError
from explorer.messages import PLAN, RUN

#: ATen base name -> canonical kind. Names not listed keep their ATen base name.
KIND_BY_ATEN_NAME: dict[str, str] = {
    **dict.fromkeys(["conv1d", "conv2d", "conv3d", "convolution", "_convolution", "cudnn_convolution"], "conv"),
    **dict.fromkeys(["conv_transpose1d", "conv_transpose2d", "conv_transpose3d"], "conv_transpose"),
    **dict.fromkeys(["batch_norm", "_native_batch_norm_legit_no_training", "native_batch_norm",
                     "_native_batch_norm_legit", "cudnn_batch_norm"], "batch_norm"),
    **dict.fromkeys(["relu", "relu_"], "relu"),
    **dict.fromkeys(["relu6", "relu6_"], "relu6"),
    **dict.fromkeys(["silu", "silu_"], "silu"),
    **dict.fromkeys(["gelu", "gelu_"], "gelu"),
    **dict.fromkeys(["hardswish", "hardswish_"], "hardswish"),
    **dict.fromkeys(["hardsigmoid", "hardsigmoid_"], "hardsigmoid"),
    **dict.fromkeys(["sigmoid", "sigmoid_"], "sigmoid"),
    **dict.fromkeys(["tanh", "tanh_"], "tanh"),
    **dict.fromkeys(["leaky_relu", "leaky_relu_"], "leaky_relu"),
    **dict.fromkeys(["elu", "elu_"], "elu"),
    **dict.fromkeys(["mish", "mish_"], "mish"),
    **dict.fromkeys(["add", "add_"], "add"),
    **dict.fromkeys(["sub", "sub_", "rsub"], "sub"),
    **dict.fromkeys(["mul", "mul_"], "mul"),
    **dict.fromkeys(["div", "div_"], "div"),
    **dict.fromkeys(["matmul", "bmm", "mm"], "matmul"),
    **dict.fromkeys(["linear", "addmm"], "linear"),
    **dict.fromkeys(["softmax", "_softmax", "_safe_softmax"], "softmax"),
    **dict.fromkeys(["layer_norm", "native_layer_norm"], "layer_norm"),
    **dict.fromkeys(["scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
                     "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
                     "_native_multi_head_attention"], "sdpa"),
    **dict.fromkeys(["dropout", "dropout_", "native_dropout", "feature_dropout"], "dropout"),
    **dict.fromkeys(["max_pool2d", "max_pool1d", "max_pool3d", "max_pool2d_with_indices"], "max_pool"),
    **dict.fromkeys(["avg_pool2d", "avg_pool1d", "avg_pool3d", "adaptive_avg_pool2d",
                     "adaptive_avg_pool1d", "_adaptive_avg_pool2d"], "avg_pool"),
    **dict.fromkeys(["contiguous", "clone", "_to_copy", "copy"], "copy"),
    **dict.fromkeys(["cat", "concat", "stack"], "cat"),
    **dict.fromkeys(["mean", "sum", "amax", "var_mean", "var"], "reduce"),
    **dict.fromkeys(["upsample_nearest2d", "upsample_bilinear2d", "_upsample_nearest_exact2d"], "upsample"),
}

#: Pure metadata ops: they launch nothing and move no bytes.
VIEW_NAMES = frozenset({
    "view", "_unsafe_view", "reshape", "permute", "transpose", "t", "expand", "expand_as",
    "unsqueeze", "squeeze", "flatten", "unflatten", "alias", "detach", "select", "slice",
    "unbind", "split", "split_with_sizes", "chunk", "narrow", "as_strided", "view_as", "reshape_as",
    "lift_fresh_copy", "getitem",
    "swapaxes", "swapdims", "mT", "numpy_T", "movedim", "moveaxis",   # transposes under other names
})

#: Ops that carry no tensor work at all and are left out of the graph view.
IGNORED_NAMES = frozenset({
    "_assert_tensor_metadata", "_assert_scalar", "sym_constrain_range_for_size",
    "sym_constrain_range", "_assert_async", "sym_size", "sym_numel", "sym_stride",
})

ACTIVATIONS = frozenset({"relu", "relu6", "silu", "gelu", "hardswish", "hardsigmoid", "sigmoid",
                         "tanh", "leaky_relu", "elu", "mish"})
ELEMENTWISE = ACTIVATIONS | frozenset({"add", "sub", "mul", "div", "exp", "erf", "pow", "sqrt",
                                       "rsqrt", "neg", "abs", "clamp", "where", "reciprocal", "log"})
TRANSPARENT = frozenset({"view", "dropout"})

#: FLOPs per element of the transcendental elementwise kinds (the cost model's one table).
TRANSCENDENTAL_FLOPS = {"gelu": 8, "silu": 4, "sigmoid": 4, "tanh": 4, "hardswish": 4, "mish": 8,
                        "elu": 4, "exp": 4, "erf": 4, "log": 4, "sqrt": 2, "rsqrt": 2, "pow": 4}


def is_view_kind(kind: str) -> bool:
    """Kinds that launch nothing: transparent ops, graph inputs, the output and weights."""
    return kind in TRANSPARENT or kind in ("input", "output", "weight")


# ====================================================================== a run's target: dtype, device, memory format

#: The dtypes a model runs in (the torch dtype of each: ``explorer.fusions.rewrite.TORCH_DTYPES``).
DTYPE_NAMES: tuple[str, ...] = ("fp32", "fp16", "bf16")
#: The dtype of the reference run (every floating tensor in float64): never a run's own dtype.
REFERENCE_DTYPE = "fp64"
#: The devices a run may ask for: ``auto`` is cuda where there is one, else cpu; ``cuda:N`` names one GPU.
DEVICE_NAMES: tuple[str, ...] = ("auto", "cpu", "cuda")
#: The memory formats a plan runs in: ``nchw`` (contiguous) or ``channels_last``.
MEMORY_FORMATS: tuple[str, ...] = ("nchw", "channels_last")

_CUDA_INDEX = re.compile(r"cuda:\d{1,3}")


class TargetError(ExplorerError):
    """A dtype, device or memory format that is not in the vocabulary (one line)."""


def parse_dtype(name: object) -> str:
    """``name`` if it is one of ``DTYPE_NAMES``; else ``TargetError``."""
    if isinstance(name, str) and name in DTYPE_NAMES:
        return name
    raise TargetError(RUN("unknown_dtype", dtype=str(name)[:40]))


def parse_device(name: object) -> str:
    """``name`` if it is one of ``DEVICE_NAMES`` or ``cuda:N``; else ``TargetError``. (Whether this machine has
    the device is the runner's question: a plan is made for CUDA on a machine without one.)"""
    if isinstance(name, str) and (name in DEVICE_NAMES or _CUDA_INDEX.fullmatch(name)):
        return name
    raise TargetError(RUN("unknown_device", device=str(name)[:40]))


def parse_memory_format(name: object) -> str:
    """``name`` if it is one of ``MEMORY_FORMATS``; else ``TargetError``."""
    if isinstance(name, str) and name in MEMORY_FORMATS:
        return name
    raise TargetError(PLAN("memory_format", choices=", ".join(MEMORY_FORMATS), got=str(name)[:40]))


@dataclasses.dataclass(frozen=True)
class Target:
    """What a fused model is made for: a device name, a dtype name and a memory format, each checked against
    the vocabulary when it is made (``TargetError``). ``auto`` stays ``auto`` here; the rewrite resolves it
    where torch can say whether CUDA is there. ``Target("cpu")`` is the CPU in fp32, contiguous."""

    device: str = "cpu"
    dtype: str = "fp32"
    memory_format: str = "nchw"

    def __post_init__(self) -> None:
        parse_device(self.device)
        parse_dtype(self.dtype)
        parse_memory_format(self.memory_format)

    @property
    def device_type(self) -> str:
        """``cpu`` or ``cuda`` (``cuda:1`` is cuda; ``auto`` is auto)."""
        return self.device.partition(":")[0]

    @property
    def channels_last(self) -> bool:
        return self.memory_format == "channels_last"

    def on(self, device: str) -> "Target":
        """The same dtype and memory format on another device (``auto`` resolved by the caller)."""
        return dataclasses.replace(self, device=device)

    def __str__(self) -> str:
        return f"{self.device}/{self.dtype}/{self.memory_format}"

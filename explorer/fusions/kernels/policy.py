"""Which paths the CNN kernels may take on CUDA: ``POLICY``, switched for a block by ``policy(...)``.

Read at call time by the convolution family's selection and by ConvNeXt's
(``POLICY`` is rebound by ``policy``: read it as ``policy_module.POLICY``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator


@dataclasses.dataclass(frozen=True)
class ConvPolicy:
    """Which paths ``select_conv_epilogue`` may take on CUDA (all on by default).

    A benchmark switches one off (``with policy(depthwise_triton=False): ...``) to
    measure what it buys, in the same run; the lean lowering bakes the choice into
    a prepared graph, so switch before ``prepare_graph``.
    """

    cudnn_relu: bool = True         # cuDNN's fused conv+bias(+add)+ReLU
    depthwise_triton: bool = True   # depthwise convs (channels_last) as one Triton kernel with their epilogue
    gemm_triton: bool = True        # 1×1 convs (channels_last) and ConvNeXt's linears as one Triton GEMM + epilogue
    #: ConvNeXt's two linears as Triton GEMMs with their epilogues (needs ``gemm_triton`` too). Off: cuBLAS
    #: plus one pass each (GELU; the residual) had the lower or level medians at all four stages of
    #: ConvNeXt-Tiny on the H200 and the lower profiled GPU time in the model (convnext.py says where); the
    #: benchmark times both.
    mlp_gemm_triton: bool = False
    #: ConvNeXt's depthwise conv + LayerNorm step: "auto" (per shape, ``convnext.DWLN_MEASURED``), or forced:
    #: "triton" (our one kernel), "cudnn_ln" (cuDNN's conv without bias + the one-pass LayerNorm adding it).
    convnext_dwln: str = "auto"
    #: ConvNeXt's MLP: "auto" (per shape, ``convnext.MLP_MEASURED``), or forced: "cublas" (cuBLAS + GELU,
    #: cuBLAS + the residual pass), "triton_fc1" (fc1 a Triton GEMM with the GELU epilogue, then cuBLAS + the
    #: residual pass), "triton_gemm" (both as Triton GEMMs with their epilogues; also what
    #: ``mlp_gemm_triton`` forces), "gelu_prologue" (cuBLAS, then one Triton GEMM that applies the GELU to
    #: its input as it loads it and adds the bias and the residual: the GELU pass is gone).
    convnext_mlp: str = "auto"
    #: The stem's, the downsamplings' and the head's LayerNorm2d as one Triton pass where ``convnext.LN2D_MEASURED``
    #: does not say torch's was faster (convnext's patterns); off: permute + layer_norm everywhere.
    convnext_ln2d: bool = True
    triton_epilogue: bool = True    # conv without bias, then one Triton pass (else: the separate torch path)


POLICY = ConvPolicy()


@contextlib.contextmanager
def policy(**changes: bool | str) -> Iterator[ConvPolicy]:
    """Run a block with some ``ConvPolicy`` switches changed; the previous policy comes back after."""
    global POLICY
    saved = POLICY
    POLICY = dataclasses.replace(saved, **changes)
    try:
        yield POLICY
    finally:
        POLICY = saved

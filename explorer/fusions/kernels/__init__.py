"""The shared kernels: fused computations that more than one family calls, each beside its reference.

Families import these; no family imports another family's internals.

- ``common``: layouts (NCHW / channels_last), convolution geometry, the per-signature launch plans;
- ``policy``: which Triton paths the CNN kernels may take (a benchmark switches one off);
- ``bias_act``: the in-place epilogue pass ``act(y + bias[c] (+ z))`` (``BIAS_ACT_TOLERANCES``);
- ``depthwise``: the depthwise convolution with its epilogue or a LayerNorm (``DEPTHWISE_TOLERANCES``);
- ``gemm``: the Triton GEMM with a bias, residual and activation epilogue (``TOLERANCES``: the epilogue's).
- ``linear_act``: the linear + activation call (cuBLASLt's bias+activation epilogue where it computes the model's
  activation, else the linear then the activation in place): ``select_linear_act`` with its labels (``WORDS``),
  ``linear_act`` and its reference, the fused call ``fused_linear_act`` and its lowering (the linear family's
  chains and ConvNeXt's first linear);
- ``packed_gemm``: several projections of one input as one GEMM (``concat_weights``, the layout the sibling linears
  and SwiGLU's gate/up share), its column views and reference (``PACKED_TOLERANCES``), and the mark
  (``packed_gemm_call``) by which another family recognises such a fused call without importing its family.

A kernel only one family calls stays in that family's module, beside its rewrite (the add + LayerNorm and the
(add +) RMSNorm kernels, which the γ fold, the family that EXTENDS rms_norm, runs too; squeeze-excite's, rotary's,
SwiGLU's); it moves here when a second family needs it.
"""

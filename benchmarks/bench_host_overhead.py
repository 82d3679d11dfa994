"""Benchmark: host (CPU) time per call of each fused kernel against the ops it replaces, on CUDA.

Whole-model runs without CUDA graphs are host-bound on the H200 machines we are lent, so what a
fused call costs the CPU decides whether it pays there. For each op the loop issues 300 calls
without synchronising: "host" is the time to issue them, "wall" includes draining the GPU.

    python3 benchmarks/bench_host_overhead.py --out $OUT/host_overhead.json   # on the GPU machine
"""
import argparse, datetime, json, sys, time
import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from explorer.fusions import attention as mms, conv as ce, linear as la, norm as aln
dev = "cuda"
torch.manual_seed(0)
def host_us(fn, n=300):
    for _ in range(20): fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n): fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) / n * 1e6, (t2 - t0) / n * 1e6
B,H,S,D = 32,12,128,64
h = torch.randn(B,S,768, device=dev, dtype=torch.float16); r = torch.randn_like(h)
w = torch.ones(768, device=dev, dtype=torch.float16); b = torch.zeros_like(w)
q = torch.randn(B,S,H,D, device=dev, dtype=torch.float16).transpose(1,2)
k = torch.randn_like(q); v = torch.randn_like(q); m = torch.zeros(B,1,S,S, device=dev, dtype=torch.float16)
x = torch.randn(32,64,56,56, device=dev).to(memory_format=torch.channels_last).half()
cw = torch.randn(64,64,3,3, device=dev).to(memory_format=torch.channels_last).half(); cb = torch.zeros(64, device=dev).half()
W = torch.randn(3072,768, device=dev, dtype=torch.float16); Wb = torch.zeros(3072, device=dev, dtype=torch.float16)
cases = {
  "add+LN eager (2 ops)": lambda: F.layer_norm(h + r, (768,), w, b),
  "add+LN triton": lambda: aln.add_layernorm(h, r, w, b, 1e-12),
  "attn explicit (5 ops)": lambda: torch.matmul(torch.softmax(torch.matmul(q, k.transpose(-1,-2)) * 0.125 + m, -1), v),
  "attn sdpa default": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.125),
  "attn kernels.attention": lambda: mms.attention(q, k, v, 0.125, m),
}
def backend(bk):
    def f():
        with sdpa_kernel([bk]):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.125)
    return f
cases["attn sdpa EFFICIENT"] = backend(SDPBackend.EFFICIENT_ATTENTION)
cases["attn sdpa CUDNN"] = backend(SDPBackend.CUDNN_ATTENTION)
cases.update({
  "conv+relu eager (2 ops)": lambda: torch.relu_(F.conv2d(x, cw, cb, 1, 1)),
  "conv+relu cudnn fused": lambda: ce.conv_epilogue(x, cw, cb, None, [1,1], [1,1], [1,1], 1, "relu"),
  "linear+gelu eager": lambda: F.gelu(F.linear(h, W, Wb)),
  "linear_act gelu": lambda: la.linear_act(h, W, Wb, "gelu"),
  "matmul_softmax triton": lambda: mms.matmul_softmax(q, k.transpose(-1,-2), 0.125, m),
})
# explorer.lean: what resolving a call once saves per call (the same kernels either way)
Wq = [torch.randn(768,768, device=dev, dtype=torch.float16) for _ in range(3)]; bq = [torch.zeros(768, device=dev, dtype=torch.float16) for _ in range(3)]
Wqkv = torch.cat(Wq); bqkv = torch.cat(bq)
holder = torch.nn.Module(); holder.register_parameter("w", torch.nn.Parameter(W, requires_grad=False))
holder.__dict__["_pin_w"] = holder.w
cases.update({
  "view: aten OpOverload": lambda: torch.ops.aten.view.default(h, [B, S, 12, 64]),
  "view: Tensor.view (lean)": lambda: h.view([B, S, 12, 64]),
  "linear: aten OpOverload": lambda: torch.ops.aten.linear.default(h, W, Wb),
  "linear: F.linear (lean)": lambda: F.linear(h, W, Wb),
  "weight read: Module.__getattr__": lambda: holder.w,
  "weight read: pinned (lean)": lambda: holder._pin_w,
  "conv+relu: direct cudnn call (lean)": lambda: torch.cudnn_convolution_relu(x, cw, cb, [1,1], [1,1], [1,1], 1),
  "QKV: 3 linears": lambda: [F.linear(h, w_, b_) for w_, b_ in zip(Wq, bq)],
  "QKV: 1 linear + split (siblings)": lambda: torch.split_with_sizes(F.linear(h, Wqkv, bqkv), [768]*3, -1),
})
parser = argparse.ArgumentParser()
parser.add_argument("--out", default="")
out_path = parser.parse_args().out
rows = []
for name, fn in cases.items():
    try:
        hu, tu = host_us(fn)
        rows.append({"op": name, "host_us_per_call": round(hu, 1), "wall_us_per_call": round(tu, 1)})
        print(f"{name:<26} host {hu:7.1f} us/call   wall {tu:7.1f} us/call")
    except Exception as e:
        rows.append({"op": name, "error": str(e).splitlines()[0][:200]})
        print(name, "FAILED", str(e).splitlines()[0][:120])
import triton
result = {"benchmark": "bench_host_overhead", "command": " ".join([sys.executable] + sys.argv),
          "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
          "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
          "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(), "rows": rows}
if out_path:
    with open(out_path, "w") as fh:
        json.dump(result, fh, indent=2)

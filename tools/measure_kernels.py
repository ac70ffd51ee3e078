#!/usr/bin/env python3
"""Kernel-level rates for stepsim's time model, measured on the GPU this runs on.

Issue 18 asks for the time model's inputs per GPU generation from kernel-level evidence:
GEMM throughput by shape and dtype, attention kernels by head dimension, sequence length and
causality, and memory-bound kernels as fractions of HBM bandwidth. stepsim has OpenXLA's
H100 BF16 GEMM table (tests/fixtures/xla_gemm_h100.csv) and FlashAttention-2's published
A100/H100 figures (src/schedule/flash_rates.rs); this measures the rest on a lent device:

    python3 tools/measure_kernels.py --out "$OUT"          # about 5 minutes on one H100

It writes, into --out:
  device.json     the GPU, its compute capability, SM count, memory, clocks as the driver
                  reports them, torch / CUDA / cuDNN versions, the date
  gemm.csv        dtype, m, n, k, median kernel seconds, TFLOP/s (2 m n k / time): BF16
                  torch.matmul and FP8 e4m3 torch._scaled_mm (per-tensor scales, BF16 out,
                  without and with fast accumulation) over transformer projection shapes and
                  square sweeps
  attention.csv   backend (flash: FlashAttention-2 via SDPA; cudnn: cuDNN fused attention),
                  causal, head dim, sequence length, batch, heads, forward and forward +
                  backward seconds, TFLOP/s in FlashAttention's count (4 b s^2 h d forward,
                  halved when causal; backward 2.5 times forward), as the FA2 and FA3 papers
                  count them, so the rows compare with flash_rates.rs
  memory.csv      kernel, bytes moved, median seconds, GB/s, share of the datasheet
                  bandwidth given with --hbm-gbs (copy, add, SwiGLU's product, softmax,
                  LayerNorm, eager RMSNorm's chain) from 8 MiB to 1 GiB

Timing: CUDA events around `reps` launches after warm-up, the median of `trials` such
groups; an L2-sized buffer is rewritten between trials so no trial starts from a warm cache
(the GEMM and attention inputs are far larger than L2 anyway). Every figure is the kernel
stream's time, launch overhead amortised over the group, as OpenXLA's table measures
kernels. Nothing here needs the network.
"""

import argparse
import csv
import datetime
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F


def timed(fn, reps, trials, flush):
    """Median seconds per call of fn over `trials` groups of `reps` calls."""
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(trials):
        flush.zero_()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) / 1e3 / reps)
    return statistics.median(out)


def device_info(hbm_gbs):
    p = torch.cuda.get_device_properties(0)
    info = {
        "name": p.name,
        "compute_capability": f"{p.major}.{p.minor}",
        "sms": p.multi_processor_count,
        "memory_bytes": p.total_memory,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "datasheet_hbm_gbs": hbm_gbs,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
    }
    try:
        import subprocess

        q = "clocks.sm,clocks.max.sm,clocks.mem,power.limit,driver_version"
        r = subprocess.run(
            ["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
        info["nvidia_smi"] = {"query": q, "answer": r.stdout.strip()}
    except Exception as e:  # the figures stand without it
        info["nvidia_smi"] = f"unavailable: {e}"
    return info


def gemm_shapes():
    """(m, n, k): transformer projections (Llama 3 8B and 70B, GPT-3 175B at TP 8) at several
    token counts, and square sweeps."""
    tokens = [512, 2048, 8192, 16384]
    projections = [
        (6144, 4096),  # Llama 3 8B q, k, v fused: n = 4096 + 2 x 1024, k = 4096
        (4096, 4096),  # its output projection
        (28672, 4096),  # its gate and up fused
        (4096, 14336),  # its down projection
        (10240, 8192),  # Llama 3 70B q, k, v fused
        (57344, 8192),  # its gate and up fused
        (8192, 28672),  # its down projection
        (4608, 12288),  # GPT-3 175B q, k, v at TP 8
        (12288, 1536),  # its output projection at TP 8
        (6144, 12288),  # its fc1 at TP 8
        (12288, 6144),  # its fc2 at TP 8
    ]
    out = [(m, n, k) for m in tokens for (n, k) in projections]
    out += [(s, s, s) for s in [256, 512, 1024, 2048, 4096, 8192, 16384]]
    return out


def measure_gemm(path, reps, trials, flush, fp8):
    rows = []
    for m, n, k in gemm_shapes():
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        t = timed(lambda: torch.matmul(a, b), reps, trials, flush)
        rows.append(("bf16", m, n, k, t, 2 * m * n * k / t / 1e12))
        if fp8:
            a8 = a.to(torch.float8_e4m3fn)
            # _scaled_mm wants the second operand column-major.
            b8 = b.t().contiguous().to(torch.float8_e4m3fn).t()
            one = torch.ones((), device="cuda", dtype=torch.float32)
            # Without and with fast accumulation (torchao's float8 training uses it for the
            # forward GEMM, Transformer Engine for all but the weight gradient's).
            for name, fast in [("fp8_e4m3", False), ("fp8_e4m3_fast_accum", True)]:
                f = lambda: torch._scaled_mm(
                    a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=fast
                )
                t = timed(f, reps, trials, flush)
                rows.append((name, m, n, k, t, 2 * m * n * k / t / 1e12))
            del a8, b8
        del a, b
        print(f"gemm {m}x{n}x{k}: {rows[-1][5]:.0f} TFLOP/s ({rows[-1][0]})", flush=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["dtype", "m", "n", "k", "seconds", "tflops"])
        w.writerows(rows)


def measure_attention(path, reps, trials, flush):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)]
    rows = []
    for name, backend in backends:
        for causal in [True, False]:
            for hd in [64, 128]:
                for seq in [512, 1024, 2048, 4096, 8192, 16384]:
                    # The FlashAttention papers' set-up: 16k tokens per batch, hidden 2048.
                    batch, heads = max(1, 16384 // seq), 2048 // hd
                    shape = (batch, heads, seq, hd)
                    q, k, v = (
                        torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)
                    )
                    g = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
                    flops = 4 * batch * seq * seq * heads * hd / (2 if causal else 1)
                    try:
                        with sdpa_kernel(backend):
                            fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                            tf = timed(fwd, reps, trials, flush)

                            def both():
                                o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                                torch.autograd.grad(o, (q, k, v), g)

                            tb = timed(both, reps, trials, flush)
                    except RuntimeError as e:  # a backend that does not take the shape
                        print(f"attention {name} causal={causal} hd={hd} seq={seq}: {e}", flush=True)
                        continue
                    rows.append(
                        (name, causal, hd, seq, batch, heads, tf, tb, flops / tf / 1e12, 3.5 * flops / tb / 1e12)
                    )
                    print(f"attention {name} causal={causal} hd={hd} seq={seq}: {rows[-1][8]:.0f} / {rows[-1][9]:.0f} TFLOP/s", flush=True)
                    del q, k, v, g
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            ["backend", "causal", "head_dim", "seq", "batch", "heads", "fwd_seconds", "fwd_bwd_seconds", "fwd_tflops", "fwd_bwd_tflops"]
        )
        w.writerows(rows)


def rms_norm_eager(x, w):
    """Hugging Face's LlamaRMSNorm, as eager PyTorch runs it (src/model/eager.rs)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    return w * h.to(x.dtype)


def measure_memory(path, reps, trials, flush, hbm_gbs):
    rows = []
    hidden = 4096
    for mib in [8, 32, 128, 512, 1024]:
        elems = mib * 2**20 // 2  # bf16
        x = torch.randn(elems // hidden, hidden, device="cuda", dtype=torch.bfloat16)
        y = torch.randn_like(x)
        w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
        b = x.numel() * 2
        kernels = [
            ("copy", lambda: x.clone(), 2 * b),
            ("add", lambda: x + y, 3 * b),
            ("silu_mul", lambda: F.silu(x) * y, 5 * b),  # two kernels: silu writes, mul reads it back
            ("softmax", lambda: torch.softmax(x, dim=-1), 2 * b),
            ("layer_norm", lambda: F.layer_norm(x, (hidden,), w, None), 2 * b),
            ("rms_norm_eager", lambda: rms_norm_eager(x, w), None),
        ]
        for name, fn, moved in kernels:
            t = timed(fn, reps, trials, flush)
            # The eager chain's bytes are counted as stepsim counts them (src/model/eager.rs):
            # left empty here, its time is what is compared.
            gbs = moved / t / 1e9 if moved else ""
            share = moved / t / 1e9 / hbm_gbs if moved and hbm_gbs else ""
            rows.append((name, mib, moved or "", t, gbs, share))
            print(f"memory {name} {mib} MiB: {t * 1e6:.1f} us {gbs if gbs == '' else f'{gbs:.0f} GB/s'}", flush=True)
        del x, y, w
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kernel", "input_mib", "bytes_moved", "seconds", "gbs", "share_of_datasheet"])
        w.writerows(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for the CSV and JSON files")
    ap.add_argument("--hbm-gbs", type=float, default=0.0, help="datasheet HBM bandwidth, GB/s (H100 SXM 3350, H200 4800)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--only", choices=["gemm", "attention", "memory"], action="append")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("measure_kernels.py: no CUDA device")
    os.makedirs(a.out, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    flush = torch.empty(256 * 2**20 // 4, device="cuda", dtype=torch.float32)
    major, _ = torch.cuda.get_device_capability()
    with open(os.path.join(a.out, "device.json"), "w") as f:
        json.dump(device_info(a.hbm_gbs), f, indent=2)
    only = set(a.only or ["gemm", "attention", "memory"])
    if "gemm" in only:
        measure_gemm(os.path.join(a.out, "gemm.csv"), a.reps, a.trials, flush, fp8=major >= 9)
    if "attention" in only:
        measure_attention(os.path.join(a.out, "attention.csv"), a.reps, a.trials, flush)
    if "memory" in only:
        measure_memory(os.path.join(a.out, "memory.csv"), a.reps, a.trials, flush, a.hbm_gbs)


if __name__ == "__main__":
    main()

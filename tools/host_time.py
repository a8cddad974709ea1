"""Host (Python) time of a Triton loss call: what bounds a loss on one 1080p image on a GPU.

Runs on the CPU in Triton's interpreter with the kernel launches replaced by no-ops (the kernels'
own time is the GPU's; what is left is argument checks, dispatch, allocations and launch set-up),
and compares the eager path (``glue.with_autograd``: the ops' functions as a plain autograd.Function)
with the custom-op dispatch that torch.compile uses, alternating in one process so that both see
the same machine. Medians of 15 rounds of 40 calls, microseconds per call:

    python tools/host_time.py
"""

import os
import statistics
import time

os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported

import torch  # noqa: E402
import triton.runtime.interpreter as I  # noqa: E402

from splatloss import functional as SF  # noqa: E402
from splatloss.backends.triton import combine as C  # noqa: E402
from splatloss.backends.triton import dssim_l1 as D  # noqa: E402
from splatloss.backends.triton import masked_ssim as MD  # noqa: E402
from splatloss.backends.triton import ms_ssim as M  # noqa: E402
from splatloss.backends.triton import ssim as S  # noqa: E402

x = torch.rand(1, 3, 32, 32)
y = torch.rand(1, 3, 32, 32)
x2 = torch.rand(1, 3, 180, 180)
y2 = torch.rand(1, 3, 180, 180)
m = torch.rand(1, 1, 32, 32)  # a soft alpha shared by the channels


def run(mode):
    if mode == "ssim fwd":
        with torch.no_grad():
            SF.ssim(x, y, backend="triton")
    elif mode == "ssim fwd+bwd":
        xg = x.clone().requires_grad_()
        (1 - SF.ssim(xg, y, backend="triton")).backward()
    elif mode == "dssim_l1 fwd+bwd":
        xg = x.clone().requires_grad_()
        SF.dssim_l1(xg, y, 0.2, padding="same", backend="triton").backward()
    elif mode == "masked dssim_l1 fwd":
        with torch.no_grad():
            SF.dssim_l1(x, y, 0.2, padding="same", mask=m, backend="triton")
    elif mode == "masked dssim_l1 fwd+bwd":
        xg = x.clone().requires_grad_()
        SF.dssim_l1(xg, y, 0.2, padding="same", mask=m, backend="triton").backward()
    elif mode == "ms_ssim fwd":
        with torch.no_grad():
            SF.ms_ssim(x2, y2, backend="triton")
    else:
        xg = x2.clone().requires_grad_()
        (1 - SF.ms_ssim(xg, y2, backend="triton")).backward()


eager = (S._term_call, D._dssim_l1_call, M._terms_call, C._combine_call, MD._dssim_l1_call)
ops = (S._term_op, D._dssim_l1_op, M._terms_op, C._combine_op, MD._dssim_l1_op)


def use(fns):
    S._term_call, D._dssim_l1_call, M._terms_call, C._combine_call, MD._dssim_l1_call = fns


def main():
    # once with the real kernels (caches, windows), then the launches stubbed out
    modes = [
        "ssim fwd",
        "ssim fwd+bwd",
        "dssim_l1 fwd+bwd",
        "masked dssim_l1 fwd",
        "masked dssim_l1 fwd+bwd",
        "ms_ssim fwd",
        "ms_ssim fwd+bwd",
    ]
    for m in modes:
        run(m)
    I.InterpretedFunction.__getitem__ = lambda self, grid: lambda *a, **k: None
    for m in modes:
        res = {"custom op": [], "eager": []}
        for fns in (ops, eager):
            use(fns)
            for _ in range(20):
                run(m)
        for r in range(15):
            for name, fns in (("custom op", ops), ("eager", eager)):
                use(fns)
                t = time.perf_counter()
                for _ in range(40):
                    run(m)
                res[name].append((time.perf_counter() - t) / 40 * 1e6)
        a, b = statistics.median(res["custom op"]), statistics.median(res["eager"])
        print(f"{m:24s} custom op {a:6.0f} us   eager {b:6.0f} us   ({a / b:.2f}x)")


if __name__ == "__main__":
    main()

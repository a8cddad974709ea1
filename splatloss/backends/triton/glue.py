"""What the Triton op files share on the host: input checks, the window cache, fake outputs for
``register_fake``, and the autograd of ops whose forward also returns their unit gradients."""

from __future__ import annotations

import functools
import os
from typing import Dict, Optional, Sequence, Tuple

import torch

from .launch import MAX_WINDOW, out_size
from .rescale import addressable, f32_quotient, rescale_, scaled

Tensor = torch.Tensor


def check_inputs(img1: torch.Tensor, img2: torch.Tensor, cfg) -> None:
    """What only the Triton backend cannot do (functional has already validated the rest)."""
    if img1.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(
            "the triton backend computes in float32 and takes float32, float16 or bfloat16 images, "
            f"got {img1.dtype}; use backend='torch' or 'reference' for float64"
        )
    if img2.dtype != img1.dtype:
        raise TypeError(f"img1 and img2 must have the same dtype, got {img1.dtype} and {img2.dtype}")
    if img1.dim() != 4 or img2.shape != img1.shape:
        raise ValueError(
            f"the triton backend expects two (B, C, H, W) images of one shape, got "
            f"{tuple(img1.shape)} and {tuple(img2.shape)}"
        )
    if img1.device != img2.device:
        raise ValueError(f"img1 and img2 must be on one device, got {img1.device} and {img2.device}")
    if img1.device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise ValueError(
            f"the triton backend needs CUDA tensors, got a tensor on {img1.device.type}; "
            "set TRITON_INTERPRET=1 (before importing triton) to run the kernels in the interpreter"
        )
    if cfg.window_size > MAX_WINDOW:
        raise ValueError(
            f"the triton backend supports window_size <= {MAX_WINDOW} (wider programs than its halo), "
            f"got {cfg.window_size}; use backend='torch' for larger windows"
        )
    if img1.shape[0] == 0 or img1.shape[1] == 0:
        raise ValueError(
            f"the triton backend needs at least one image and one channel, got shape {tuple(img1.shape)}; "
            "drop empty batches before the loss, or use backend='torch' (empty / NaN results)"
        )
    h, w = img1.shape[-2:]
    need = cfg.min_size()
    if h < need or w < need:
        raise ValueError(
            f"images must be at least {need}x{need} for window_size={cfg.window_size} and "
            f"padding={cfg.padding!r}, got {h}x{w}"
        )


class functorch_guard:
    """Turn torch's message for a ``torch.func.grad`` / ``jvp`` transform over our custom ops
    ("...autograd.Function with functorch transforms... must override the setup_context...") into
    an error that says what to do. (``vmap`` works, through torch's per-sample fallback.)"""

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if kind is RuntimeError and "functorch transforms" in str(exc):
            raise ValueError(
                "the triton backend does not support torch.func transforms (grad, jvp, jacrev, ...); "
                "use backend='torch' or 'reference' with torch.func"
            ) from exc
        return False


#: Whether a torch.func transform (vmap, grad, jvp) is active; a torch without the query is
#: treated as if one were (the custom op then always runs).
_functorch_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: True)


def eager(*tensors: Tensor) -> bool:
    """Whether a call may skip the custom-op dispatch: not under ``torch.compile`` or a
    ``torch.func`` transform, and every tensor a plain ``torch.Tensor`` (the tensors an
    ahead-of-time trace of a backward passes are fake or functional subclasses, which need the op)."""
    if torch.compiler.is_compiling() or _functorch_active():
        return False
    return all(type(t) is torch.Tensor for t in tensors)


def with_autograd(op, impl, setup_context, backward):
    """Register ``setup_context`` and ``backward`` as the autograd of ``op`` (a
    ``torch.library.custom_op`` made from ``impl``) and return the function to call it by: the
    op, or where nothing needs the custom op, the same three functions the cheap way.

    In eager mode the same three functions run as a plain ``torch.autograd.Function``: the
    dispatcher's round trips of a custom op (autograd kernel, redispatch, the compiler guard
    around the implementation, default filling) are a fifth to a quarter of a loss call's Python
    time, and at one 1080p image on a GPU that time, not the kernels, bounds the call. Under
    ``torch.compile`` (the op is what the graph holds) and under ``torch.func`` transforms (the
    op's vmap fallback and error messages) the custom op runs. The same kernels either way, so
    the results are bitwise the same."""

    op.register_autograd(backward, setup_context=setup_context)

    def forward(ctx, *args):
        out = impl(*args)
        setup_context(ctx, args, out)
        # an op returning a list of tensors: a Function's outputs are a tuple (its backward then
        # gets one gradient per tensor, where the op's backward gets them as one list)
        return tuple(out) if isinstance(out, list) else out

    # named after the op, so that its graph node reads e.g. ``term_eagerBackward``
    name = f"{impl.__name__.strip('_').removesuffix('_impl')}_eager"
    methods = {"forward": staticmethod(forward), "backward": staticmethod(backward)}
    Eager = type(name, (torch.autograd.Function,), methods)

    def call(*args):
        return Eager.apply(*args) if eager() else op(*args)

    return call


def refuse_double_backward(op: str) -> None:
    """Called first in every backward of the Triton ops. Autograd runs a backward with gradient
    mode on only when the caller asked for a graph of the gradient (``create_graph=True``:
    double backward, a gradient penalty, a Hessian-vector product). The kernels' analytic
    gradient is not differentiable again, and returned without a graph it would make the second
    derivative silently zero, so it is refused here."""
    if torch.is_grad_enabled():
        raise ValueError(
            f"the triton backend's {op} has no second derivative: its gradient was asked for with "
            "create_graph=True (double backward, a gradient penalty, a Hessian-vector product), "
            "which would silently differentiate as zero; use backend='torch' or 'reference' for "
            "losses that are differentiated twice"
        )


#: The windows built so far, by (window, size, sigma, device).
WINDOWS_CACHE: Dict[tuple, torch.Tensor] = {}


def window_taps(cfg, device: torch.device) -> torch.Tensor:
    """The 1-D window as a float32 tensor on ``device``, built once per (window, device)."""
    key = (cfg.window, cfg.window_size, cfg.sigma, str(device))
    w = WINDOWS_CACHE.get(key)
    if w is None:
        w = cfg.window_1d(torch.float32, device).contiguous()
        WINDOWS_CACHE[key] = w
    return w


@functools.lru_cache(maxsize=64)
def _unit_upstreams(sizes: Tuple[int, ...], bc: int, device: str, scale: float) -> torch.Tensor:
    return torch.tensor([[scale / n] * bc for n in sizes], dtype=torch.float32).to(device)


def unit_upstreams(sizes: Sequence[int], bc: int, device: torch.device, scale: float = 1.0) -> torch.Tensor:
    """``[len(sizes), bc]`` float32 on ``device``: row ``k`` is ``scale / sizes[k]`` (rounded once
    from float64), the upstream gradient of a mean over ``sizes[k]`` map pixels in every (image,
    channel) whose own upstream is ``scale``. Built once per (sizes, bc, device, scale) and shared:
    the kernels only read it, and a training loop then launches no fills for it."""
    return _unit_upstreams(tuple(int(n) for n in sizes), int(bc), str(device), float(scale))


def wants_grad(t: Tensor) -> bool:
    """Whether autograd will ask for a gradient of ``t`` (decided in the forward)."""
    return torch.is_grad_enabled() and t.requires_grad


def map_numel(img: Tensor, window: Tensor, padding: str) -> int:
    """Pixels of one channel's SSIM map."""
    K = window.shape[0]
    return out_size(img.shape[-2], K, padding) * out_size(img.shape[-1], K, padding)


def fake_grads(img1: Tensor, img2: Tensor, need1: bool, need2: bool) -> Tuple[Tensor, Tensor]:
    """Gradients as :func:`.backward.launch_bwd` allocates them: img1's layout, and img2's gradient
    in img1's layout too when both are computed (img2's own layout only when it is the sole
    gradient)."""
    gx = torch.empty_like(img1) if need1 else img1.new_empty(0)
    if not need2:
        return gx, img2.new_empty(0)
    return gx, (torch.empty_like(img1, dtype=img2.dtype) if need1 else torch.empty_like(img2))


def fake_unit_grads(img1: Tensor, img2: Tensor, need1: bool, need2: bool) -> Tuple[Tensor, Tensor]:
    """float32 gradients in the layouts :func:`.backward.launch_bwd` gives them (see
    :func:`fake_grads`)."""
    gx, gy = fake_grads(img1, img2, need1, need2)
    return gx.to(torch.float32), gy.to(torch.float32)


def zeros_if_none(g: Optional[Tensor], like_shape, device) -> Tensor:
    return g if g is not None else torch.zeros(like_shape, dtype=torch.float32, device=device)


def save_unit_grads(ctx, img1: Tensor, img2: Tensor, window: Tensor, gx: Tensor, gy: Tensor, *extra: Tensor) -> None:
    """setup_context of an op whose forward also returned its gradients for a unit upstream
    gradient (``gx`` / ``gy``, float32, empty where not computed): keep them with the inputs
    (and ``extra`` inputs its recompute needs, such as a mask)."""
    ctx.save_for_backward(img1, img2, window, gx, gy, *extra)
    ctx.mark_non_differentiable(gx, gy)
    ctx.set_materialize_grads(False)  # no zero-filled upstream gradients for gx / gy (4 B each)
    ctx.unit_used = False


def batch_mean_upstream(img: Tensor) -> float:
    """The upstream gradient each image's loss gets from ``loss.mean().backward()`` over the batch of
    ``img``: ``1 / B`` rounded to float32 as autograd's mean backward rounds it. A loss that bakes
    it into its kept gradient hands that gradient on untouched (:mod:`.rescale`), which only the
    eager path does with float32 images; elsewhere (``torch.compile`` or a ``torch.func`` transform,
    where the custom op runs; float16 / bfloat16 images, whose gradient is converted in any case)
    the backward scales out of place, and this is 1, so that no division joins that pass."""
    return f32_quotient(1.0, int(img.shape[0])) if eager() and img.dtype == torch.float32 else 1.0


def dssim_mean_upstream(img: Tensor) -> float:
    """The upstream gradient each (image, channel) mean of the SSIM map gets from the D-SSIM loss
    ``1 - ssim(x, y)`` (or ``dssim``, ``SSIMLoss``) reduced by the mean and backpropagated: ``-1 / B``
    then divided by ``C``, each rounded to float32 as autograd's mean backwards round them. As
    :func:`batch_mean_upstream`: eager with float32 images, else 1."""
    if not (eager() and img.dtype == torch.float32):
        return 1.0
    return f32_quotient(-1.0, int(img.shape[0]), int(img.shape[1]))


def batch_mean_factor(g: Optional[Tensor], B: int, expect: float) -> Optional[Tensor]:
    """The per-image factor a batch-mean loss op's backward scales its kept gradients by (``[B]``,
    with :func:`backward_from_unit_grads` and ``expect=1``): where the forward kept them for each
    image's upstream ``1 / B`` (eager, float32: ``expect`` is that), the mean's upstream ``g`` as it
    is; where it kept them for an upstream of 1 per image (``expect == 1``), ``g / B`` as autograd's
    mean backward forms it (the same for one image)."""
    if g is None:
        return None
    if B == 1 or expect == 1.0:
        return g.expand(B) / B
    return g.reshape(1).expand(B)


def backward_from_unit_grads(
    ctx, upstream: Optional[Tensor], dims: int, recompute, op: str, n_inputs: int = 9, expect: float = 1.0
) -> tuple:
    """The backward of such an op (``n_inputs`` inputs, the two images first): scale the kept gradients by
    ``upstream / expect``, one scalar per leading index (``dims`` of them: per image, or per image
    and channel), and return them in each input's dtype. ``expect`` is the upstream the forward
    baked into them (1: none).

    Eager, with float32 images: in place (:func:`.rescale.rescale_`), where the upstream is
    ``expect`` without touching the gradient, and handed on; a second backward through the same
    graph (``retain_graph=True``) then finds them used and recomputes. Otherwise one elementwise
    pass each, into a new tensor (the same numbers). An input that needs a gradient its forward did
    not compute (it did not need one then) gets ``recompute(img1, img2, window, need1, need2,
    *extra) -> (gx, gy)`` (for the actual upstream). ``op`` names the op in the error a double
    backward gets (:func:`refuse_double_backward`)."""
    refuse_double_backward(op)
    need1, need2 = bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1])
    rest = (None,) * (n_inputs - 2)
    if not (need1 or need2) or upstream is None:
        return (None, None) + rest
    img1, img2, window, gx, gy, *extra = ctx.saved_tensors
    if getattr(ctx, "unit_used", False) or (need1 and gx.numel() == 0) or (need2 and gy.numel() == 0):
        gx, gy = recompute(img1, img2, window, need1, need2, *extra)
        return (gx if need1 else None, gy if need2 else None) + rest
    u = upstream.to(torch.float32)
    wanted = [(g, img) for g, img, need in ((gx, img1, need1), (gy, img2, need2)) if need]
    if eager(u, *(g for g, _ in wanted)) and all(_in_place(g, img, u) for g, img in wanted):
        ctx.unit_used = True
        return (rescale_(gx, u, expect) if need1 else None, rescale_(gy, u, expect) if need2 else None) + rest
    u = u.reshape(u.shape + (1,) * (4 - dims))
    return (
        _scaled(gx, u, img1.dtype, expect) if need1 else None,
        _scaled(gy, u, img2.dtype, expect) if need2 else None,
    ) + rest


def _in_place(g: Tensor, img: Tensor, u: Tensor) -> bool:
    """Whether the kept gradient ``g`` of ``img`` can be scaled in place and handed on: the image
    is float32 (the gradient's own dtype) and the kernel addresses ``g``'s layout
    (:func:`.rescale.addressable`)."""
    return img.dtype == torch.float32 and addressable(g, u)


def _scaled(g: Tensor, u: Tensor, dtype: torch.dtype, expect: float) -> Tensor:
    """``(g * (u / expect)).to(dtype)`` (:func:`.rescale.scaled`): for float16 / bfloat16 images
    (whose ``expect`` is 1) one elementwise pass, the float32 product rounded once as it is stored,
    never written in float32 first."""
    return scaled(g, u, expect, torch.empty_like(g, dtype=dtype))

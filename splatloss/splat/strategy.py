"""Densification and pruning of :class:`~splatloss.splat.gaussians.Gaussians` (the 3DGS rules).

Why not gsplat's ``DefaultStrategy``: its operations (``gsplat.strategy.ops``) address the
parameters by gsplat's names (``params["scales"]``, ``params["opacities"]``) and expect one
optimizer per parameter in a dict; here the parameters are ``log_scales`` / ``opacity_logits`` and
one Adam holds one named group per parameter (``Gaussians.param_names``: five, six with ``sh_rest``
beyond SH degree 0). The rules are the same as 3DGS / gsplat's default strategy:

- accumulate, for each Gaussian drawn in a step, the norm of the gradient of the loss w.r.t. its
  2D mean in normalised device units (pixel gradient times ``width / 2``, ``height / 2``, as gsplat);
- every ``refine_every`` steps in ``[refine_start, refine_stop)``: Gaussians whose average is above
  ``grow_grad2d`` are duplicated when small (largest scale <= ``grow_scale3d * extent``) and split in
  two when large (new means sampled from the Gaussian, scales divided by 1.6); then Gaussians with
  opacity below ``prune_opa`` (and, after the first opacity reset, those larger than
  ``prune_scale3d * extent``) are removed;
- every ``reset_every`` steps opacities are clamped down to ``2 * prune_opa`` (0 disables);
- ``max_gaussians`` caps the count: when growth would pass it, only the highest-gradient
  candidates grow. This bounds the CPU renderer's step time.

Adam's moments follow their parameters: rows of removed Gaussians are dropped, new rows start at
zero. Random numbers (split sampling) come from torch's global generator, which the training
module checkpoints.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional

import torch
from torch import Tensor, nn

from splatloss.splat.gaussians import Gaussians

__all__ = ["DensifyStrategy"]


def _quat_to_rotmat(q: Tensor) -> Tensor:
    q = q / q.norm(dim=-1, keepdim=True)
    w, x, y, z = q.unbind(-1)
    return torch.stack(
        [
            1 - 2 * (y * y + z * z),
            2 * (x * y - w * z),
            2 * (x * z + w * y),
            2 * (x * y + w * z),
            1 - 2 * (x * x + z * z),
            2 * (y * z - w * x),
            2 * (x * z - w * y),
            2 * (y * z + w * x),
            1 - 2 * (x * x + y * y),
        ],
        dim=-1,
    ).reshape(q.shape[:-1] + (3, 3))


class DensifyStrategy:
    """3DGS-style adaptive density control for :class:`Gaussians` trained with one Adam.

    Used by the training module as ``pre_backward(out)`` before backward, then
    ``post_step(gaussians, optimizer, out, step) -> bool`` (True when the set of Gaussians changed)
    after the optimizer step; ``state_dict()`` / ``load_state_dict()`` checkpoint the accumulators.

    The defaults are the settings measured on the default scene (docs/splat.md): ``grow_grad2d`` is
    6x 3DGS's 2e-4 because on 64x64 views the normalised gradients are larger (median ~4e-4, 90th
    percentile ~1.6e-3 after 100 steps; with 2e-4 a test run grew 83 % of its Gaussians at the first
    refinement);
    no opacity reset within the short CPU runs; at most 6000 Gaussians.

    Args:
        extent: scene radius (``SceneData.extent``); 3D thresholds are fractions of it.
        grow_grad2d: average normalised 2D-mean gradient above which a Gaussian grows.
        grow_scale3d: duplicate (<=) or split (>) by largest scale relative to ``extent``.
        prune_opa: opacity below which a Gaussian is removed.
        prune_scale3d: largest scale (relative to ``extent``) above which a Gaussian is removed,
            once opacities have been reset at least once.
        refine_start, refine_stop, refine_every: when densification runs (steps).
        reset_every: opacity reset period in steps (0 = never).
        max_gaussians: upper bound on the number of Gaussians (None = unbounded).

    Examples:
        >>> s = DensifyStrategy(extent=4.0)
        >>> sorted(s.state_dict())
        ['count', 'grad2d', 'n_resets']
    """

    def __init__(
        self,
        extent: float,
        grow_grad2d: float = 0.0012,
        grow_scale3d: float = 0.01,
        prune_opa: float = 0.005,
        prune_scale3d: float = 0.1,
        refine_start: int = 100,
        refine_stop: int = 1000,
        refine_every: int = 100,
        reset_every: int = 0,
        max_gaussians: Optional[int] = 6000,
    ):
        checks = {
            "extent": (extent, lambda v: v > 0),
            "grow_grad2d": (grow_grad2d, lambda v: v >= 0),
            "grow_scale3d": (grow_scale3d, lambda v: v > 0),
            "prune_opa": (prune_opa, lambda v: 0 <= v < 1),
            "prune_scale3d": (prune_scale3d, lambda v: v > 0),
        }
        for name, (v, ok) in checks.items():
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or not ok(v):
                raise ValueError(f"DensifyStrategy: {name} out of range, got {v!r}")
        for name, v in (("refine_start", refine_start), ("refine_stop", refine_stop), ("reset_every", reset_every)):
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"DensifyStrategy: {name} must be an integer >= 0, got {v!r}")
        if not isinstance(refine_every, int) or refine_every < 1:
            raise ValueError(f"DensifyStrategy: refine_every must be an integer >= 1, got {refine_every!r}")
        if max_gaussians is not None and (not isinstance(max_gaussians, int) or max_gaussians < 1):
            raise ValueError(f"DensifyStrategy: max_gaussians must be an integer >= 1 or None, got {max_gaussians!r}")
        self.extent = float(extent)
        self.grow_grad2d = float(grow_grad2d)
        self.grow_scale3d = float(grow_scale3d)
        self.prune_opa = float(prune_opa)
        self.prune_scale3d = float(prune_scale3d)
        self.refine_start = refine_start
        self.refine_stop = refine_stop
        self.refine_every = refine_every
        self.reset_every = reset_every
        self.max_gaussians = max_gaussians
        self.grad2d: Optional[Tensor] = None
        self.count: Optional[Tensor] = None
        self.n_resets = 0
        self.last_stats: Dict[str, int] = {}

    # -- checkpointing ----------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        return {"grad2d": self.grad2d, "count": self.count, "n_resets": self.n_resets}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        missing = {"grad2d", "count", "n_resets"} - set(state)
        if missing:
            raise ValueError(f"DensifyStrategy.load_state_dict: missing keys {sorted(missing)}")
        self.grad2d, self.count, self.n_resets = state["grad2d"], state["count"], int(state["n_resets"])

    # -- hooks ------------------------------------------------------------------------------------
    def pre_backward(self, out: Dict[str, Any]) -> None:
        """Keep the gradient of the projected means (the renderer already asks for it)."""
        m = out["means2d"]
        if m.requires_grad and not m.is_leaf:
            m.retain_grad()

    @torch.no_grad()
    def post_step(self, gaussians: Gaussians, optimizer: torch.optim.Optimizer, out: Dict[str, Any], step: int) -> bool:
        if step >= self.refine_stop:
            return False
        self._accumulate(gaussians, out)
        changed = False
        if step > self.refine_start and step % self.refine_every == 0:
            self._refine(gaussians, optimizer)
            changed = True
        if self.reset_every and step > 0 and step % self.reset_every == 0:
            self._reset_opacity(gaussians, optimizer)
        return changed

    # -- internals --------------------------------------------------------------------------------
    def _accumulate(self, g: Gaussians, out: Dict[str, Any]) -> None:
        grad = out["means2d"].grad
        n = g.num
        if self.grad2d is None or self.grad2d.shape[0] != n:
            self.grad2d = torch.zeros(n, device=g.means.device)
            self.count = torch.zeros(n, device=g.means.device)
        if grad is None:
            return
        grad = grad.detach().reshape(-1, 2).clone()
        grad[:, 0] *= out["width"] / 2.0 * out.get("n_cameras", 1)
        grad[:, 1] *= out["height"] / 2.0 * out.get("n_cameras", 1)
        visible = (out["radii"].reshape(n, -1) > 0).all(dim=-1)
        # torch.where, not boolean-mask indexing: a mask index is a nonzero(), i.e. a GPU -> CPU
        # sync on every training step. Adding 0 leaves the other entries bitwise unchanged.
        self.grad2d += torch.where(visible, grad.norm(dim=-1), torch.zeros_like(self.grad2d))
        self.count += visible.to(self.count.dtype)

    def _refine(self, g: Gaussians, optimizer) -> None:
        n = g.num
        avg = self.grad2d / self.count.clamp_min(1)
        high = avg > self.grow_grad2d
        if self.max_gaussians is not None:
            room = max(self.max_gaussians - n, 0)
            if int(high.sum()) > room:  # grow only the strongest candidates (a split adds 1 net, too)
                keep = torch.zeros_like(high)
                if room > 0:
                    keep[torch.topk(torch.where(high, avg, torch.full_like(avg, -1.0)), room).indices] = True
                high = high & keep
        small = g.log_scales.exp().max(dim=-1).values <= self.grow_scale3d * self.extent
        dup = high & small
        split = high & ~small
        n_dup, n_split = int(dup.sum()), int(split.sum())
        # Duplicate: append copies. Split: append two samples per selected Gaussian, drop it.
        params = {k: getattr(g, k).detach() for k in g.param_names}  # sh_rest too, when the degree is > 0
        new_rows = {k: [v[dup]] for k, v in params.items()}
        if n_split:
            sel = split
            scales = params["log_scales"][sel].exp()
            R = _quat_to_rotmat(params["quats"][sel])
            samples = torch.randn(2, n_split, 3, device=scales.device)
            offset = torch.einsum("nij,bnj->bni", R, scales[None] * samples)  # [2, S, 3]
            new_rows["means"].append((params["means"][sel][None] + offset).reshape(-1, 3))
            new_rows["log_scales"].append(torch.log(scales / 1.6).repeat(2, 1))
            for k in [k for k in params if k not in ("means", "log_scales")]:  # the parent's: rotation, opacity, SH
                v = params[k][sel]
                new_rows[k].append(torch.cat([v, v]))
        keep = ~split
        opac = torch.sigmoid(params["opacity_logits"])
        prune = opac < self.prune_opa
        if self.n_resets > 0:
            prune |= params["log_scales"].exp().max(dim=-1).values > self.prune_scale3d * self.extent
        keep &= ~prune
        n_new = n_dup + 2 * n_split
        self._rebuild(g, optimizer, keep, new_rows, n_new)
        self.grad2d = torch.zeros(g.num, device=g.means.device)
        self.count = torch.zeros(g.num, device=g.means.device)
        self.last_stats = {"duplicated": n_dup, "split": n_split, "pruned": int((prune & ~split).sum()), "num": g.num}

    def _rebuild(self, g: Gaussians, optimizer, keep: Tensor, new_rows: Dict[str, list], n_new: int) -> None:
        for k in g.param_names:
            old = getattr(g, k)
            data = torch.cat([old.detach()[keep]] + new_rows[k])
            param = nn.Parameter(data, requires_grad=old.requires_grad)
            for group in optimizer.param_groups:
                if group["params"][0] is old:
                    state = optimizer.state.pop(old, None)
                    group["params"][0] = param
                    if state:
                        for key in ("exp_avg", "exp_avg_sq"):
                            if key in state:
                                s = state[key]
                                state[key] = torch.cat([s[keep], s.new_zeros((n_new,) + s.shape[1:])])
                        optimizer.state[param] = state
            setattr(g, k, param)

    def _reset_opacity(self, g: Gaussians, optimizer) -> None:
        cap = math.log(2 * self.prune_opa / (1 - 2 * self.prune_opa))
        old = g.opacity_logits
        old.data.clamp_(max=cap)
        state = optimizer.state.get(old)
        if state:
            for key in ("exp_avg", "exp_avg_sq"):
                if key in state:
                    state[key].zero_()
        self.n_resets += 1

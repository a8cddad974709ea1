"""3D Gaussians as an ``nn.Module`` and their export to the 3DGS ``.ply`` layout."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from ..atomic import atomic_output

__all__ = ["Gaussians", "MAX_SH_DEGREE", "SH_C0", "num_sh_bases", "read_ply", "rgb_to_sh", "sh_to_rgb"]

SH_C0 = 0.28209479177387814  # the degree-0 spherical harmonic basis value, 1 / (2 sqrt(pi))
MAX_SH_DEGREE = 3  # as 3DGS and the viewers that read its .ply (45 f_rest fields at degree 3)


def num_sh_bases(degree: int) -> int:
    """Number of real SH basis functions up to ``degree``: ``(degree + 1) ** 2``."""
    return (degree + 1) ** 2


def rgb_to_sh(rgb: torch.Tensor) -> torch.Tensor:
    """RGB in [0, 1] -> SH DC coefficient (3DGS convention: colour = 0.5 + SH_C0 * dc)."""
    return (rgb - 0.5) / SH_C0


def sh_to_rgb(sh: torch.Tensor) -> torch.Tensor:
    return sh * SH_C0 + 0.5


def _knn_mean_dist(points: torch.Tensor, k: int = 3, chunk: int = 2048) -> torch.Tensor:
    """Mean distance of each point to its ``k`` nearest neighbours (chunked brute force)."""
    n = points.shape[0]
    if n <= 1:
        return torch.ones(n, dtype=points.dtype)
    k = min(k, n - 1)
    out = torch.empty(n, dtype=points.dtype)
    for s in range(0, n, chunk):
        d = torch.cdist(points[s : s + chunk], points)  # [c, N]
        d = d.topk(k + 1, dim=1, largest=False).values[:, 1:]  # drop the point itself
        out[s : s + chunk] = d.mean(dim=1)
    return out


class Gaussians(nn.Module):
    """A set of N anisotropic 3D Gaussians with view-dependent colour (spherical harmonics, 3DGS layout).

    Parameters (all ``nn.Parameter``, one optimizer group each):
        means ``[N, 3]``: centres, world coordinates.
        quats ``[N, 4]``: rotations as (w, x, y, z) quaternions, not necessarily normalised.
        log_scales ``[N, 3]``: log of the standard deviations along the rotated axes.
        opacity_logits ``[N]``: opacity = sigmoid(opacity_logits).
        colors ``[N, 3]``: the SH DC coefficient of each channel (3DGS ``features_dc``),
            so at degree 0 RGB = 0.5 + SH_C0 * colors (clamped at 0 by the renderer, as gsplat).
        sh_rest ``[N, (d + 1)^2 - 1, 3]``: the higher SH coefficients up to the maximum degree
            ``d = sh_degree`` (3DGS ``features_rest``, gsplat's ``shN``); only when ``d > 0``.
            At degree 0 there is no such parameter: the module, its state dict and its ``.ply``
            are those of view-independent colour.

    ``sh_degree`` is the maximum degree (0..3); ``active_sh_degree`` (0 at construction) is the
    degree the renderer evaluates, which training raises on a schedule (3DGS: one degree every 1000
    steps). ``param_names`` names this instance's parameters; the class attribute is the degree-0 set.

    Examples:
        >>> g = Gaussians.random(8, extent=1.0, seed=0)
        >>> g.num, tuple(g.scales.shape), bool((g.opacities > 0).all())
        (8, (8, 3), True)
        >>> g3 = Gaussians.random(8, seed=0, sh_degree=3)
        >>> tuple(g3.sh_rest.shape), g3.active_sh_degree, g3.param_names[-1]
        ((8, 15, 3), 0, 'sh_rest')
    """

    param_names = ("means", "quats", "log_scales", "opacity_logits", "colors")
    # Class defaults, so that a degree-0 instance (or one assembled without __init__) needs no more.
    sh_degree = 0
    active_sh_degree = 0

    def __init__(self, means, quats, log_scales, opacity_logits, colors, sh_rest=None):
        super().__init__()
        if not isinstance(means, torch.Tensor) or means.ndim != 2:
            got = tuple(means.shape) if isinstance(means, torch.Tensor) else type(means).__name__
            raise TypeError(f"Gaussians: means must be a torch.Tensor of shape [N, 3], got {got}")
        n = means.shape[0]
        shapes = {
            "means": (means, (n, 3)),
            "quats": (quats, (n, 4)),
            "log_scales": (log_scales, (n, 3)),
            "opacity_logits": (opacity_logits, (n,)),
            "colors": (colors, (n, 3)),
        }
        for name, (t, shape) in shapes.items():
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"Gaussians: {name} must be a torch.Tensor, got {type(t).__name__}")
            if tuple(t.shape) != shape:
                raise ValueError(f"Gaussians: {name} must have shape {shape}, got {tuple(t.shape)}")
        self.means = nn.Parameter(means.detach().clone().float())
        self.quats = nn.Parameter(quats.detach().clone().float())
        self.log_scales = nn.Parameter(log_scales.detach().clone().float())
        self.opacity_logits = nn.Parameter(opacity_logits.detach().clone().float())
        self.colors = nn.Parameter(colors.detach().clone().float())
        if sh_rest is not None:
            if not isinstance(sh_rest, torch.Tensor):
                raise TypeError(f"Gaussians: sh_rest must be a torch.Tensor, got {type(sh_rest).__name__}")
            ks = {num_sh_bases(d) - 1: d for d in range(MAX_SH_DEGREE + 1)}
            if sh_rest.ndim != 3 or sh_rest.shape[0] != n or sh_rest.shape[2] != 3 or sh_rest.shape[1] not in ks:
                raise ValueError(
                    f"Gaussians: sh_rest must have shape ({n}, K, 3) with K in {sorted(ks)} "
                    f"(SH degree 0..{MAX_SH_DEGREE}), got {tuple(sh_rest.shape)}"
                )
            degree = ks[sh_rest.shape[1]]
            if degree > 0:
                self.sh_degree = degree
                self.sh_rest = nn.Parameter(sh_rest.detach().clone().float())
                self.param_names = Gaussians.param_names + ("sh_rest",)
        self.active_sh_degree = 0

    # -- construction -----------------------------------------------------------------------------
    @classmethod
    def from_points(
        cls,
        points: torch.Tensor,
        colors: torch.Tensor | None = None,
        init_opacity: float = 0.5,
        scale_mult: float = 1.0,
        seed: int = 0,
        sh_degree: int = 0,
    ) -> "Gaussians":
        """Isotropic Gaussians at ``points [N, 3]`` with RGB ``colors [N, 3]`` (grey when None).

        The scale of each is its mean distance to its 3 nearest neighbours (times ``scale_mult``),
        as in 3DGS; quaternions are random (seeded) unit rotations. ``sh_degree`` (0..3) is the
        maximum SH degree: the colour goes to the DC term, the higher coefficients start at zero
        (3DGS), so the Gaussians look the same from every direction until trained.
        """
        points = torch.as_tensor(points, dtype=torch.float32)
        if points.ndim != 2 or points.shape[1] != 3 or points.shape[0] < 1:
            raise ValueError(
                f"Gaussians.from_points: points must have shape [N, 3] with N >= 1, got {tuple(points.shape)}"
            )
        n = points.shape[0]
        if colors is None:
            colors = torch.full((n, 3), 0.5)
        colors = torch.as_tensor(colors, dtype=torch.float32)
        if tuple(colors.shape) != (n, 3):
            raise ValueError(f"Gaussians.from_points: colors must have shape ({n}, 3), got {tuple(colors.shape)}")
        if not 0.0 < init_opacity < 1.0:
            raise ValueError(f"Gaussians.from_points: init_opacity must be in (0, 1), got {init_opacity}")
        if not isinstance(sh_degree, int) or isinstance(sh_degree, bool) or not 0 <= sh_degree <= MAX_SH_DEGREE:
            raise ValueError(
                f"Gaussians.from_points: sh_degree must be an integer in 0..{MAX_SH_DEGREE}, got {sh_degree!r}"
            )
        g = torch.Generator().manual_seed(seed)
        dist = _knn_mean_dist(points).clamp_min(1e-7) * scale_mult
        log_scales = torch.log(dist)[:, None].repeat(1, 3)
        quats = torch.randn(n, 4, generator=g)
        quats = quats / quats.norm(dim=-1, keepdim=True)
        logit = math.log(init_opacity / (1 - init_opacity))
        sh_rest = torch.zeros(n, num_sh_bases(sh_degree) - 1, 3) if sh_degree > 0 else None
        return cls(points, quats, log_scales, torch.full((n,), logit), rgb_to_sh(colors.clamp(0, 1)), sh_rest)

    @classmethod
    def random(cls, n: int, extent: float = 1.0, seed: int = 0, **kwargs) -> "Gaussians":
        """``n`` Gaussians uniform in the cube ``[-extent, extent]^3`` with random colours."""
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"Gaussians.random: n must be an integer >= 1, got {n!r}")
        g = torch.Generator().manual_seed(seed)
        pts = (torch.rand(n, 3, generator=g) * 2 - 1) * extent
        cols = torch.rand(n, 3, generator=g)
        return cls.from_points(pts, cols, seed=seed, **kwargs)

    # -- derived quantities -----------------------------------------------------------------------
    @property
    def num(self) -> int:
        return self.means.shape[0]

    @property
    def scales(self) -> torch.Tensor:
        return torch.exp(self.log_scales)

    @property
    def opacities(self) -> torch.Tensor:
        return torch.sigmoid(self.opacity_logits)

    @property
    def rgb(self) -> torch.Tensor:
        return sh_to_rgb(self.colors)

    def set_active_sh_degree(self, degree: int) -> None:
        """Set the degree the renderer evaluates (0..``sh_degree``)."""
        if not isinstance(degree, int) or isinstance(degree, bool) or not 0 <= degree <= self.sh_degree:
            raise ValueError(
                f"Gaussians.set_active_sh_degree: degree must be an integer in 0..{self.sh_degree} "
                f"(the Gaussians' sh_degree), got {degree!r}"
            )
        self.active_sh_degree = degree

    def sh_coeffs(self, degree: int | None = None) -> torch.Tensor:
        """The SH coefficients up to ``degree`` (default: ``active_sh_degree``) as
        ``[N, (degree + 1)^2, 3]``, DC first: what ``gsplat.rasterization(colors=..., sh_degree=degree)``
        takes. At degree 0 this is ``colors[:, None, :]`` alone (``sh_rest`` is not touched)."""
        degree = self.active_sh_degree if degree is None else degree
        if not 0 <= degree <= self.sh_degree:
            raise ValueError(f"Gaussians.sh_coeffs: degree must be in 0..{self.sh_degree}, got {degree!r}")
        dc = self.colors[:, None, :]
        if degree == 0:
            return dc
        return torch.cat([dc, self.sh_rest[:, : num_sh_bases(degree) - 1]], dim=1)

    def params(self) -> dict:
        """The parameters by name (the keys of :attr:`param_names`)."""
        return {k: getattr(self, k) for k in self.param_names}

    def replace_params(self, new: dict) -> None:
        """Swap every parameter for a new tensor (densification); all must share one N."""
        n = {k: v.shape[0] for k, v in new.items()}
        if set(n) != set(self.param_names) or len(set(n.values())) != 1:
            raise ValueError(f"Gaussians.replace_params: expected all of {self.param_names} with one N, got {n}")
        for k, v in new.items():
            setattr(self, k, v if isinstance(v, nn.Parameter) else nn.Parameter(v))

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        # A checkpoint may hold a different number of Gaussians (densification): resize first.
        for k in self.param_names:
            if k in state_dict and state_dict[k].shape != getattr(self, k).shape:
                setattr(self, k, nn.Parameter(torch.empty_like(state_dict[k])))
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    # -- export -----------------------------------------------------------------------------------
    def export_ply(self, path: str) -> None:
        """Write the Gaussians as a binary little-endian ``.ply`` in the layout of the 3DGS
        reference (x y z nx ny nz f_dc_0..2 f_rest_0..M-1 opacity scale_0..2 rot_0..3; opacity as a
        logit and scales as logs, as that viewer ecosystem expects). ``f_rest`` holds every
        coefficient of the maximum degree, channel-major as 3DGS's ``save_ply`` writes it
        (``features_rest.transpose(1, 2).flatten(1)``: all of red's, then green's, then blue's):
        ``M = 3 * ((d + 1)^2 - 1)``, 45 at degree 3, none at degree 0. Written to a temporary file
        in the same directory and moved into place, so a reader never sees a partial file."""
        with torch.no_grad():
            m = self.means.detach().cpu().float().numpy()
            n = m.shape[0]
            cols = [
                ("x", m[:, 0]),
                ("y", m[:, 1]),
                ("z", m[:, 2]),
                ("nx", np.zeros(n, np.float32)),
                ("ny", np.zeros(n, np.float32)),
                ("nz", np.zeros(n, np.float32)),
            ]
            dc = self.colors.detach().cpu().float().numpy()
            cols += [(f"f_dc_{i}", dc[:, i]) for i in range(3)]
            if self.sh_degree > 0:
                rest = self.sh_rest.detach().cpu().float().transpose(1, 2).reshape(n, -1).numpy()
                cols += [(f"f_rest_{i}", rest[:, i]) for i in range(rest.shape[1])]
            cols += [("opacity", self.opacity_logits.detach().cpu().float().numpy())]
            ls = self.log_scales.detach().cpu().float().numpy()
            cols += [(f"scale_{i}", ls[:, i]) for i in range(3)]
            q = self.quats.detach().cpu().float().numpy()
            cols += [(f"rot_{i}", q[:, i]) for i in range(4)]
        dtype = np.dtype([(name, "<f4") for name, _ in cols])
        data = np.empty(n, dtype=dtype)
        for name, v in cols:
            data[name] = v
        header = "ply\nformat binary_little_endian 1.0\n"
        header += f"element vertex {n}\n"
        header += "".join(f"property float {name}\n" for name, _ in cols)
        header += "end_header\n"
        with atomic_output(path) as tmp, open(tmp, "wb") as fh:
            fh.write(header.encode("ascii"))
            fh.write(data.tobytes())

    @classmethod
    def from_ply(cls, path: str) -> "Gaussians":
        """Load Gaussians written by :meth:`export_ply` (or by 3DGS's ``save_ply``): the SH degree
        follows from the number of ``f_rest_*`` fields (0, 9, 24 or 45)."""
        d = read_ply(path)
        need = ["x", "y", "z", "f_dc_0", "f_dc_1", "f_dc_2", "opacity"]
        need += [f"scale_{i}" for i in range(3)] + [f"rot_{i}" for i in range(4)]
        missing = [k for k in need if k not in d]
        if missing:
            raise ValueError(f"Gaussians.from_ply: {path!r} lacks the 3DGS fields {missing}")
        bad = [k for k, v in d.items() if not np.isfinite(v).all()]
        if bad:
            raise ValueError(f"Gaussians.from_ply: {path!r} has NaN or infinite values in the fields {bad}")
        n_rest = sum(1 for k in d if k.startswith("f_rest_"))
        degrees = {3 * (num_sh_bases(k) - 1): k for k in range(MAX_SH_DEGREE + 1)}
        if n_rest not in degrees or any(f"f_rest_{i}" not in d for i in range(n_rest)):
            raise ValueError(
                f"Gaussians.from_ply: {path!r} has {n_rest} f_rest_* fields; expected f_rest_0..M-1 with M in "
                f"{sorted(degrees)} (SH degree 0..{MAX_SH_DEGREE})"
            )

        def stack(names):
            return torch.from_numpy(np.stack([d[k] for k in names], axis=1))

        n = d["x"].shape[0]
        sh_rest = None
        if n_rest:
            # Channel-major on disk ([N, 3, K-1] flattened): back to [N, K-1, 3].
            sh_rest = stack([f"f_rest_{i}" for i in range(n_rest)]).reshape(n, 3, -1).transpose(1, 2)
        return cls(
            stack(["x", "y", "z"]),
            stack([f"rot_{i}" for i in range(4)]),
            stack([f"scale_{i}" for i in range(3)]),
            torch.from_numpy(d["opacity"]),
            stack(["f_dc_0", "f_dc_1", "f_dc_2"]),
            sh_rest,
        )


def read_ply(path: str) -> dict:
    """Read back a binary little-endian float-only ``.ply`` written by :meth:`Gaussians.export_ply`
    as ``{property name: np.ndarray}``."""
    with open(path, "rb") as fh:
        raw = fh.read()
    end = raw.find(b"end_header\n")
    if not raw.startswith(b"ply\n") or end < 0:
        raise ValueError(f"read_ply: {path!r} is not a ply file (expected a 'ply' header ending in 'end_header')")
    header = raw[:end].decode("ascii").splitlines()
    if "format binary_little_endian 1.0" not in header:
        raise ValueError(f"read_ply: {path!r}: expected format binary_little_endian 1.0, got {header[1]!r}")
    try:
        n = next(int(h.split()[2]) for h in header if h.startswith("element vertex"))
    except (StopIteration, IndexError, ValueError):
        raise ValueError(f"read_ply: {path!r}: expected 'element vertex <count>' in the header") from None
    names = [h.split()[2] for h in header if h.startswith("property float")]
    dtype = np.dtype([(k, "<f4") for k in names])
    body = raw[end + len(b"end_header\n") :]
    if len(body) < n * dtype.itemsize:
        raise ValueError(
            f"read_ply: {path!r} is truncated: the header promises {n} vertices of {dtype.itemsize} bytes "
            f"({n * dtype.itemsize} bytes), the file holds {len(body)} after the header"
        )
    arr = np.frombuffer(body, dtype=dtype, count=n)
    return {k: np.array(arr[k]) for k in names}

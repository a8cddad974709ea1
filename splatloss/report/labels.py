"""Readable names: a loss by its name and parameters ("D-SSIM + L1 (λ = 0.2)"), float overrides
rounded to the digits that tell them apart, text made safe for Markdown, LaTeX and HTML."""

from __future__ import annotations

import html
import re
from typing import Dict, Iterable, Optional

__all__ = [
    "loss_label",
    "readable_overrides",
    "round_float",
    "md_cell",
    "tex",
    "html_text",
]

_FLOAT = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+(\.\d*)?[eE][+-]?\d+)$")


def _significant(text: str) -> int:
    """Significant digits of a decimal literal (``"0.250"`` -> 2, ``"3.0"`` -> 1)."""
    mantissa = re.split(r"[eE]", text.lstrip("+-"))[0].replace(".", "")
    return max(1, len(mantissa.strip("0")))


def round_float(text: str, digits: int = 4) -> str:
    """A float literal with at most ``digits`` significant digits; other text unchanged.

    Examples:
        >>> round_float("0.5488135039273248"), round_float("0.20000000000000001"), round_float("3.0")
        ('0.5488', '0.2', '3.0')
        >>> round_float("1e-05"), round_float("adam"), round_float("12")
        ('1e-05', 'adam', '12')
    """
    if not _FLOAT.match(text):
        return text
    value = float(text)
    shortest = repr(value)  # the shortest text that reads back as this float
    return shortest if _significant(shortest) <= digits else f"{value:.{digits}g}"


def readable_overrides(overrides: Iterable[str], digits: int = 4) -> Dict[str, str]:
    """``{override: shown}``: float values rounded by :func:`round_float` to ``digits`` significant
    digits, or to more where two different values of one key would otherwise look the same.

    Examples:
        >>> readable_overrides(["a=0.123456", "a=0.123457", "b=0.5488135039273248"])["a=0.123456"]
        'a=0.123456'
        >>> readable_overrides(["a=0.123456", "b=0.5488135039273248"])["b=0.5488135039273248"]
        'b=0.5488'
    """
    overrides = list(overrides)
    by_key: Dict[str, set] = {}
    for o in overrides:
        k, sep, v = o.partition("=")
        if sep and _FLOAT.match(v):
            by_key.setdefault(k, set()).add(v)
    shown = {o: o for o in overrides}
    for k, values in by_key.items():
        d = digits
        while d < 17 and len({float(round_float(v, d)) for v in values}) < len({float(v) for v in values}):
            d += 1
        for v in values:
            shown[f"{k}={v}"] = f"{k}={round_float(v, d)}"
    return shown


# PhotometricLoss terms (its keyword arguments) and how a paper names them.
_TERMS = {"l1": "L1", "l2": "L2", "dssim": "D-SSIM", "msssim": "MS-SSIM", "l1_gaussian": "G·L1", "s3im": "S3IM"}
# The presets (PhotometricLoss class methods): name and mixing parameter.
_PRESETS = {
    "dssim_l1": ("D-SSIM + L1", "lambda_dssim", "λ"),
    "msssim_l1": ("MS-SSIM + L1", "alpha", "α"),
    "zhao_mix": ("MS-SSIM + G·L1 (Zhao)", "alpha", "α"),
}
# The loss config keys a loss label already shows (a swept one is not repeated after it).
LABEL_KEYS = {"lambda_dssim", "alpha", *_TERMS}


def _num(value, shown: Optional[str] = None) -> str:
    if shown is not None:
        return shown
    if isinstance(value, float):
        return round_float(repr(value))
    return str(value)


def loss_label(config: Dict, name: Optional[str] = None, shown: Optional[Dict[str, str]] = None) -> str:
    """A loss as a paper names it, from its resolved config (``metrics.json``'s ``loss``).

    Args:
        config: the loss config (``_target_`` and its arguments).
        name: the loss group's choice (``loss_name``), used when the target is not one splatloss knows.
        shown: ``{key: text}`` of parameter values as the report shows them (rounded to the digits
            that tell the sweep's values apart); default: each value's shortest text.

    Examples:
        >>> loss_label({"_target_": "splatloss.losses.PhotometricLoss.dssim_l1", "lambda_dssim": 0.2})
        'D-SSIM + L1 (λ = 0.2)'
        >>> loss_label({"_target_": "splatloss.losses.PhotometricLoss", "l1": 1.0})
        'L1'
        >>> loss_label({"_target_": "splatloss.losses.PhotometricLoss", "l1": 0.8, "dssim": 0.2})
        '0.8 L1 + 0.2 D-SSIM'
    """
    shown = shown or {}
    target = str(config.get("_target_", ""))
    if not target.startswith("splatloss."):
        return name or target or "?"
    fn = target.rsplit(".", 1)[-1]
    if fn in _PRESETS:
        title, key, symbol = _PRESETS[fn]
        if key in config:
            return f"{title} ({symbol} = {_num(config[key], shown.get(key))})"
        return title
    if fn == "PhotometricLoss":
        terms = [(k, config[k]) for k in _TERMS if isinstance(config.get(k), (int, float)) and config[k] > 0]
        if len(terms) == 1 and float(terms[0][1]) == 1.0:
            return _TERMS[terms[0][0]]
        if terms:
            return " + ".join(f"{_num(w, shown.get(k))} {_TERMS[k]}" for k, w in terms)
    return name or fn


def md_cell(text) -> str:
    """Text safe in one Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


_TEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}
_TEX_UNICODE = {
    "λ": r"$\lambda$",
    "α": r"$\alpha$",
    "σ": r"$\sigma$",
    "τ": r"$\tau$",
    "Δ": r"$\Delta$",
    "±": r"$\pm$",
    "−": "--",
    "–": "--",
    "·": r"$\cdot$",
    "×": r"$\times$",
    "≥": r"$\geq$",
    "≤": r"$\leq$",
    "↑": r"$\uparrow$",
    "↓": r"$\downarrow$",
    "<": "$<$",
    ">": "$>$",
}
_TEX_MINUS = re.compile(r"(?<![\w.])-(?=\d)")


def tex(text) -> str:
    """Text safe in LaTeX, with the Greek letters and signs the report uses written as math.

    Examples:
        >>> tex("D-SSIM + L1 (λ = 0.2)"), tex("loss_share 5%"), tex("[-0.09, 0.08]")
        ('D-SSIM + L1 ($\\\\lambda$ = 0.2)', 'loss\\\\_share 5\\\\%', '[$-$0.09, 0.08]')
    """
    text = "".join(_TEX_UNICODE.get(c, _TEX_SPECIAL.get(c, c)) for c in str(text))
    return _TEX_MINUS.sub("$-$", text)  # a negative number's sign, not a hyphen


def html_text(text) -> str:
    return html.escape(str(text))

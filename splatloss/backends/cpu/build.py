"""Building the C kernel: compiler discovery, the build and its on-disk cache.

The kernel is ``_ssim_cpu.c`` beside this file, compiled at first use with the system C compiler:
``$CC`` when it is set (and only it, so ``CC=/nonexistent`` really means "no compiler"), else the
first of ``cc``, ``gcc``, ``clang`` on the ``PATH``. The shared library is cached under
``$SPLATLOSS_CACHE_DIR`` (default ``$XDG_CACHE_HOME/splatloss`` or ``~/.cache/splatloss``), keyed
by the source, the flags, the compiler's version and the CPU's feature flags (the build uses
``-march=native``), and written atomically, so concurrent processes never load a half-written file.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

__all__ = ["compiler", "build", "FIXED_TAPS"]

_SOURCE = Path(__file__).with_name("_ssim_cpu.c")
_BASE_FLAGS = ["-O3", "-fPIC", "-shared", "-fno-math-errno", "-ffp-contract=fast", "-std=gnu11"]
FIXED_TAPS = 11  # window size with its own build (the default)


def _cache_dir() -> Path:
    env = os.environ.get("SPLATLOSS_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "splatloss"


def compiler() -> Optional[str]:
    """Path of the C compiler to use: ``$CC`` if set (``None`` if it is not found), else the first of
    ``cc``, ``gcc``, ``clang`` found on the ``PATH``, else ``None``."""
    env = os.environ.get("CC")
    names = (env,) if env else ("cc", "gcc", "clang")
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return None


def _cpu_signature() -> str:
    """The CPU's feature flags (the build is -march=native: never load it on another CPU)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line
    except OSError:
        pass
    return platform.processor() + platform.machine()


def build(cc: str, real: str, taps: int = 0) -> Path:
    """Path of the shared library for ``real`` ("float" or "double") and ``taps`` (0: any window),
    compiled with ``cc`` unless the cache already holds it."""
    src = _SOURCE.read_bytes()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60).stdout
    key_flags = None
    errors = []
    # -march=native first; a compiler that does not know it gets the portable build.
    for arch in (["-march=native"], []):
        flags = _BASE_FLAGS + arch + [f"-DREAL={real}", f"-DREAL_BYTES={8 if real == 'double' else 4}"]
        flags += [f"-DFIXED_TAPS={taps}"] if taps else []
        key = hashlib.sha256(src + " ".join(flags).encode() + version.encode() + _cpu_signature().encode())
        out = _cache_dir() / f"ssim_cpu_{real}_k{taps}_{key.hexdigest()[:16]}.so"
        if out.exists():
            return out
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
        os.close(fd)
        try:
            proc = subprocess.run([cc, *flags, "-o", tmp, str(_SOURCE)], capture_output=True, text=True, timeout=300)
            if proc.returncode == 0:
                os.replace(tmp, out)  # atomic: other processes see the old state or the whole file
                return out
            errors.append(proc.stderr.strip()[-500:])
            key_flags = flags
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    raise RuntimeError(f"{cc} {' '.join(key_flags or [])} failed: {errors[-1] if errors else ''}")

"""One way to write an output file so that nothing is lost on failure.

Every file splatloss writes (checkpoints, metrics.json, renders, .ply, benchmark results, the CPU
kernel's shared library) goes through :func:`atomic_output`: the content is written to a temporary
file in the destination's own folder (a rename across file systems would be a copy, not atomic),
flushed to disk, and moved over the destination with ``os.replace``. A reader sees the old file or
the whole new one; a failure half-way leaves the old file untouched and no temporary behind.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Dict, Iterator

__all__ = ["atomic_output", "check_output_file", "check_writable"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_output(path) -> Iterator[str]:
    """Yield a temporary path beside ``path``; on a clean exit it becomes ``path``, atomically.

    Args:
        path: the destination (str or os.PathLike). Its folder is created if missing.

    Yields:
        The temporary file's path (it exists, empty, with the destination's suffix, so writers that
        infer a format from the name still work). Write the whole content there.

    Examples:
        >>> import os, tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     target = os.path.join(d, "metrics.json")
        ...     with atomic_output(target) as tmp:
        ...         _ = open(tmp, "w").write("{}")
        ...     try:
        ...         with atomic_output(target) as tmp:
        ...             raise RuntimeError("crash mid-write")
        ...     except RuntimeError:
        ...         pass
        ...     open(target).read(), sorted(os.listdir(d))
        ('{}', ['metrics.json'])
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.splitext(path)[1])
    os.close(fd)
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)  # the data is on disk before the rename makes it visible
        finally:
            os.close(fd)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the usual mode
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def check_writable(folders: Dict[str, str], instead: str) -> None:
    """Each ``{what: folder}`` can receive files: the folder, or the nearest folder above it that
    exists (where it would be created), takes a probe file. Nothing is created but the probe,
    which is removed. ``instead``: what the message suggests choosing instead.

    Raises:
        ValueError: naming what the folder is for, the folder and the reason.
    """
    for what, folder in folders.items():
        folder = os.path.abspath(folder)
        probe = folder
        while not os.path.exists(probe) and os.path.dirname(probe) != probe:
            probe = os.path.dirname(probe)
        where = "" if probe == folder else f" (it would be created in {probe!r})"
        if not os.path.isdir(probe):
            raise ValueError(
                f"cannot write the {what} to {folder!r}: {probe!r} is a file, not a folder; move it away or choose "
                f"{instead}"
            )
        try:
            fd, tmp = tempfile.mkstemp(dir=probe, prefix=".splatloss-write-test-")
            os.close(fd)
            os.unlink(tmp)
        except OSError as e:
            raise ValueError(
                f"cannot write the {what} to {folder!r}{where}: {e.strerror or e}. Make it writable or choose {instead}"
            ) from None


def check_output_file(flag: str, path: str) -> None:
    """The file a command-line tool was asked to write (``flag``: its option, e.g. ``--json``) can be
    written: ``path`` is not a folder and its folder can receive files (:func:`check_writable`).

    Raises:
        ValueError: naming the option, the path and the reason.
    """
    if os.path.isdir(path):
        raise ValueError(f"{flag} {path!r} is a folder; give a file name")
    check_writable({f"{flag} file": os.path.dirname(os.path.abspath(path))}, instead=f"another {flag} path")

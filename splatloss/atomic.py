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
from typing import Iterator

__all__ = ["atomic_output"]


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

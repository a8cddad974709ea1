"""Session-wide test set-up.

TRITON_INTERPRET must be set before Triton is first imported (no GPU exists where this project is
built: kernels are checked in the interpreter), and torch runs single-threaded because this is a
shared 2-core machine where torch's intra-op pool is slower than one thread on small ops.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

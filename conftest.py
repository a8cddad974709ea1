"""Session-wide test set-up.

Without a CUDA device the Triton kernels run in the interpreter: TRITON_INTERPRET=1 is set here,
before Triton is first imported (``import torch`` does not import it). With a CUDA device it is
left unset, so the Triton backend runs compiled on the GPU (the ``gpu`` marker selects those
tests). Tests run torch single-threaded: on small test images the intra-op pool costs more than
it saves. The Triton launches keep their planned rows per program (no timing on CUDA).
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
# The launches' rows per program as planned, not measured on CUDA (splatloss.backends.triton.tune):
# tests that set the geometry get it; tests/backends/test_triton_tune.py turns the measuring on.
os.environ.setdefault("SPLATLOSS_TRITON_TUNE", "0")

import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

torch.set_num_threads(1)

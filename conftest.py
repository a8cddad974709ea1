"""Session-wide test set-up.

Without a CUDA device the Triton kernels run in the interpreter: TRITON_INTERPRET=1 is set here,
before Triton is first imported (``import torch`` does not import it). With a CUDA device it is
left unset, so the Triton backend runs compiled on the GPU (the ``gpu`` marker selects those
tests). Tests run torch single-threaded: on small test images the intra-op pool costs more than
it saves.
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

torch.set_num_threads(1)

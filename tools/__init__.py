"""Maintainer tooling, run from a checkout (not part of the wheel): each module is also a script.

- ``bench.py``: times every backend and the peer libraries (``python tools/bench.py``, ``./dev bench``).
- ``check_kernels.py``: compiles every Triton kernel for sm_80 / sm_90 and, with ``--cost``, counts
  what the loss calls' kernels issue (``python tools/check_kernels.py``, ``./dev kernels``).
- ``sass_cost.py``: the launch model and its tables (``python tools/sass_cost.py``).
- ``kernel_analysis.py``: what a compiled kernel issues, from its SASS and Triton IR (a leaf).
- ``host_time.py``: the host time of eager calls through Triton's launch path over a stub driver.

Imports point one way: ``sass_cost`` -> ``check_kernels`` -> ``kernel_analysis``, and ``sass_cost`` ->
``kernel_analysis`` (tests/test_tools_imports.py checks it). Modules import one another as
``tools.<module>``; run as a script, a module first puts the repository root on ``sys.path``.
"""

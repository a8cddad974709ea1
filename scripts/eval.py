#!/usr/bin/env python
"""Evaluate a trained run without training: ``python scripts/eval.py ckpt_path=RUN/checkpoints/last.ckpt``.

All the work is in :mod:`splatloss.evaluate`; the options are in ``configs/eval.yaml``.
"""

from splatloss.evaluate import main

if __name__ == "__main__":
    main()

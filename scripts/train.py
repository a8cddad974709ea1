#!/usr/bin/env python
"""Train Gaussians with a splatloss photometric loss: ``python scripts/train.py loss=dssim_l1``.

All the work is in :mod:`splatloss.train`; the Hydra configs are in ``configs/``.
"""

from splatloss.train import main

if __name__ == "__main__":
    main()

"""``python -m splatloss.report RUN_DIR ...``: the same as ``splatloss-report``."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())

"""``python -m ccl_sim serve [serve flags] [--seed N] [--tick S] [--job-ends-after S]``."""

import sys

from ccl_sim.serve import main

sys.exit(main())

"""`python -m coordinator.driver ARGS...`: what scripts/run.sh execs (run.py)."""

import sys

from coordinator.driver.run import main

sys.exit(main(sys.argv[1:]))

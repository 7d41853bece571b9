"""`python -m openrlhf_band.tasks reward-file TASK | agent-file TASK | preflight TASK | list`."""

import sys

from openrlhf_band.tasks import _cli

sys.exit(_cli(sys.argv[1:]))

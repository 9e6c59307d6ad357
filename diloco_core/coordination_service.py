"""``python -m diloco_core.coordination_service``: the coordination service of an elastic run.

The entry point of :mod:`diloco_core.launch.coordination_service` (run it on one host of a
multi-host elastic run; ``launch --own-coordinator`` starts it on one machine).
"""

import sys

from diloco_core.launch.coordination_service import main

if __name__ == "__main__":
  sys.exit(main())

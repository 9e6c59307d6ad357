"""``python -m diloco_core.launch``: the supervisor's command line (:mod:`diloco_core.launch.supervisor`)."""

import sys

from diloco_core.launch.supervisor import main

if __name__ == "__main__":
  sys.exit(main())

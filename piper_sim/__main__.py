"""`python -m piper_sim ...` runs the CLI (for machines where the package is on PYTHONPATH, not installed)."""

import sys

from piper_sim.cli import main

if __name__ == "__main__":
    sys.exit(main())

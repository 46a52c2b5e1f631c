"""`python -m piper_sim ...` runs the CLI (for machines where the package is on PYTHONPATH, not installed)."""

from piper_sim.cli import main

if __name__ == "__main__":
    main()

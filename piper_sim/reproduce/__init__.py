"""`piper-sim reproduce`: the Piper paper's experiments as one command (run.py)."""

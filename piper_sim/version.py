"""The version of piper-sim (imports nothing)."""

__version__ = "0.1.0"

"""piper-sim: predict and validate the training speed of pipelined expert-parallel MoE models."""

__version__ = "0.1.0"

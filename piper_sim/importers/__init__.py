"""Configs from where users have them: a Megatron-LM argument list or a torchtitan TOML -> a piper-sim config
(docs/importing.md). `piper-sim import megatron|torchtitan` (importers/cli.py) writes it as YAML."""

"""The defaults a command chose without being told, said as notes: one line each on stderr.

Owns which silent defaults change an answer enough to be said (the sequence length a preset brings, the
cost profile and why it was taken (piper_sim.profile_choice), the topology, the routing, the placement of
ranks onto nodes) and their wording. The
machine's own notes (a topology built smaller than the machine) come with it (Topology.notes). Pure:
reads a Config and, for placement, the built topology; prints nothing.
"""

from __future__ import annotations

from piper_sim.config import DEFAULTS, Config
from piper_sim.profile_choice import profile_name

# a key left out of the config -> what its default means for the answer, and how to change it
SILENT_DEFAULTS = {
    "cost.profile": "{value}, {reason} (its peak FLOP/s and efficiencies price every task; set cost.profile, "
    "`piper-sim presets` lists them)",
    "topology": "{value} (a generic cluster, not a named machine; set topology to frontier, lumi, ...)",
    "routing": "kind {value} (every expert receives the same share of tokens; set routing.kind to zipf, "
    "dirichlet or trace for skewed experts)",
}


def config_notes(cfg: Config, keys: tuple[str, ...] = ("seq_len", *SILENT_DEFAULTS)) -> list[str]:
    """Notes on the defaults among keys that cfg's user left out ("seq_len": the model's sequence length), after
    the values the config took in the user's place (Config.taken)."""
    out = list(cfg.taken)
    for key in keys:
        if key == "seq_len":
            if "model.seq_len" not in cfg.given:
                out.append(
                    f"{cfg.model.name} runs at the sequence length its preset or config file gives, "
                    f"{cfg.model.seq_len:,} tokens (set model.seq_len to change it)"
                )
        elif key == "cost.profile" and key not in cfg.given:
            out.append(
                f"{key} not given: "
                + SILENT_DEFAULTS[key].format(value=profile_name(cfg.cost_profile), reason=cfg.profile_reason)
            )
        elif key not in cfg.given:
            out.append(f"{key} not given: " + SILENT_DEFAULTS[key].format(value=_default(key)))
    return out


def placement_notes(cfg: Config, topology, placement: list[str] | tuple[str, ...]) -> list[str]:
    """A note when the placement was left to its default, the job spans more than one node and the machine has
    nodes the job does not use (inside one node, or on a machine of just the job's nodes, the default chose
    nothing); and when one was given for a job inside one node, where no placement changes anything."""
    nodes = {topology.host_of(gpu) for gpu in placement}
    if "placement" in cfg.given:
        if len(nodes) == 1:
            return [
                f"placement {cfg.placement!r} cannot change the result: the job's {len(placement)} GPUs are one "
                "node, so every group is inside it"
            ]
        return []
    if len(nodes) < 2 or topology.num_hosts <= len(nodes):
        return []
    return [
        f"placement not given: {DEFAULTS['placement']} (ranks fill the machine's first {len(nodes)} nodes in "
        "order); set placement to switch-packed, scattered or a list of nodes"
    ]


def _default(key: str) -> object:
    section, _, sub = key.partition(".")
    value = DEFAULTS[section]
    if sub:
        value = value[sub]
    return value["kind"] if isinstance(value, dict) and "kind" in value else value

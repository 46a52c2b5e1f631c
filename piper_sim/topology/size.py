"""How large a machine a builder may build for a job, and what building it costs, checked before it is built.

Owns check_machine_size: a builder counts the links its parameters would build (the graph's directed links, plus the
node model's GPU-pair paths, which grow with the square of gpus_per_node) and calls it before building anything. A
machine of more than MACHINE_LINKS_PER_GPU links per GPU of the job, and more than MACHINE_LINKS_FLOOR links, is larger
than the job needs by orders of magnitude (shipped machines build 6-133 links per GPU): it is refused with a
ConfigError naming the size parameter that made it so. A machine that would not fit in this machine's available
memory is refused the same way; one whose build takes more than BUILD_NOTE_S says so on stderr first.

The per-link costs are measured here (tests hold none of them): `load_topology("uniform", 1048576)` builds 6,291,456
links in 43 s and 3.5 GiB of peak resident memory (6.8 us, 590 B a link); dgx-h100-superpod with num_spines 65536
for 8 GPUs 1,048,624 links in 3.0 s and 480 MiB (2.8 us, 480 B); fat-tree with num_spines 65536 131,120 links in
1.1 s (8.5 us: more switches per link). docs/performance.md, "Machine size", gives the figures and the command.
"""

from __future__ import annotations

import sys

from piper_sim.errors import ConfigError
from piper_sim.host_memory import GIB, MARGIN_BYTES, available_memory_bytes

BUILD_S_PER_LINK = 7e-6  # networkx graph, link arrays: 2.8-8.5 us a link (module docstring)
BUILD_BYTES_PER_LINK = 600  # peak resident growth while building: 480-590 B a link
# a machine may hold this many links per GPU of the job: shipped machines build 6-131 (Frontier's group of 32 switches
# for 8 GPUs), a dragonfly of small groups more at scale (the generic example, 133 at 65,536 GPUs: its groups' pairs)
MACHINE_LINKS_PER_GPU = 256
MACHINE_LINKS_FLOOR = 1_000_000  # ... or this many whatever the job (about 7 s and 600 MB to build)
JOB_SIZED = ("num_nodes", "num_groups")  # size parameters that, left out, follow the job
BUILD_NOTE_S = 2.0  # a build expected to take longer says so before it starts


def build_seconds(links: int) -> float:
    """The seconds building a machine of `links` links takes on this machine (BUILD_S_PER_LINK)."""
    return links * BUILD_S_PER_LINK


def machine_links_limit(num_gpus: int | None) -> int:
    """The most links a machine built for a job of num_gpus GPUs may have (None: the job's size is not known)."""
    return max(MACHINE_LINKS_FLOOR, MACHINE_LINKS_PER_GPU * (num_gpus or 0))


def check_machine_size(
    name: str, terms: dict[str, int], num_gpus: int | None, values: dict[str, int], where: str = "topology.params."
) -> None:
    """Before a builder builds a machine for a job of num_gpus GPUs: refuse one far larger than the job needs, or one
    that does not fit in this machine's memory; say a build that takes more than BUILD_NOTE_S. terms: the links the
    builder would build, by the size parameter that sets their number ("": the job's own size); values: the
    parameters' values. A refusal names the parameter of the largest term (none: `topology`, fewer GPUs)."""
    links = sum(terms.values())
    key = max(terms, key=terms.__getitem__)
    value = values[key] if key else f"{num_gpus:,} GPUs"
    name_key = f"{where}{key}" if key else "topology"
    cost = (
        f"{links:,} links, about {build_seconds(links):,.0f} s and {links * BUILD_BYTES_PER_LINK / GIB:.1f} GiB "
        "to build"
    )
    limit = machine_links_limit(num_gpus)
    if links > limit:
        job = f"a {num_gpus:,}-GPU job" if num_gpus else "a machine"
        lower = (
            f"a smaller {key}" + (", or none to build just the job's nodes" if key in JOB_SIZED else "")
            if key
            else "fewer GPUs"
        )
        raise ConfigError(
            name_key, value, f"a machine of at most {limit:,} links for {job} (these parameters make {cost}): {lower}"
        )
    available = available_memory_bytes()
    if available is not None and links * BUILD_BYTES_PER_LINK > available - MARGIN_BYTES:
        raise ConfigError(
            name_key,
            value,
            f"a machine that fits in this machine's {available / GIB:.1f} GiB available "
            f"less {MARGIN_BYTES / GIB:.0f} GiB ({cost})",
        )
    if build_seconds(links) > BUILD_NOTE_S:
        print(f"piper-sim: building topology {name}: {cost}", file=sys.stderr, flush=True)


def host_key(p: dict, gpus_per_node: int, num_gpus: int | None) -> str:
    """The parameter that sets how many hosts a builder builds: num_nodes where the config gave it, gpus_per_node
    where one node holds more GPUs than the job has, else none (the job's own nodes)."""
    if p.get("num_nodes") is not None:
        return "num_nodes"
    return "gpus_per_node" if num_gpus is not None and gpus_per_node > num_gpus else ""

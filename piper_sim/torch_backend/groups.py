"""Process-group cache: each distinct rank set gets one torch.distributed group, created once.

Owns subgroup creation. Groups are created with use_local_synchronization=True, so only the member
ranks call new_group and the group's name is a hash of its ranks: ranks outside a group never need to
take part. Every member must request the groups it shares with others in the same order (the
all-to-all algorithms do: EP group, then node group, then rail group).
Only piper_sim.torch_backend may import torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.distributed as dist


class GroupCache:
    """Maps a set of global ranks to its process group (the default group for the whole world)."""

    def __init__(self) -> None:
        self._groups: dict[tuple[int, ...], dist.ProcessGroup] = {}

    def get(self, ranks: Sequence[int]) -> dist.ProcessGroup:
        key = tuple(sorted(set(ranks)))
        if dist.get_rank() not in key:
            raise ValueError(f"rank {dist.get_rank()} asked for group {key} it is not a member of")
        if len(key) == dist.get_world_size():
            return dist.group.WORLD
        group = self._groups.get(key)
        if group is None:
            group = dist.new_group(list(key), use_local_synchronization=True)
            self._groups[key] = group
        return group

    def clear(self) -> None:
        """Drop the cached groups. Do it before destroy_process_group: a group object that outlives
        it is torn down at interpreter exit, which can abort the process (seen with gloo)."""
        self._groups.clear()


DEFAULT_GROUPS = GroupCache()


def shutdown() -> None:
    """Clear the default cache, then destroy every process group (after a barrier)."""
    if not dist.is_initialized():
        return
    dist.barrier()  # no rank tears its connections down while a peer still uses them
    DEFAULT_GROUPS.clear()
    dist.destroy_process_group()

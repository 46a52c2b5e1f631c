"""Launch ranks as separate processes, optionally inside testbed network namespaces.

Owns starting one `rank_main` process per rank with the rendezvous environment, watching them, and
stopping all of them (process groups, so no orphans) when one fails or the deadline passes, with an
error naming the rank. Only piper_sim.torch_backend may import torch (this module does not need it).
"""

from __future__ import annotations

import os
import pickle
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from piper_sim.errors import PiperError
from piper_sim.torch_backend.lifetime import children_ignore_interrupts, preexec_rank


def launch_processes(
    target: str,
    args: tuple,
    world: int,
    out_dir: Path,
    *,
    rank_env: dict[int, dict[str, str]],
    rank_prefix: dict[int, list[str]],
    master_addr: str,
    timeout_s: float,
) -> None:
    """Run target ("module:function", called as function(rank, world, *args)) on world ranks.

    rank_prefix[r] wraps rank r's command (e.g. `ip netns exec NS`); logs go to out_dir/logs/.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    spec_path = out_dir / "job.pkl"
    spec_path.write_bytes(pickle.dumps((target, args)))
    port = str(random.Random(os.getpid() ^ int(time.time())).randint(20000, 40000))
    logs = out_dir / "logs"
    logs.mkdir(exist_ok=True)
    procs: list[subprocess.Popen] = []
    try:
        for rank in range(world):
            env = {
                **os.environ,
                "MASTER_ADDR": master_addr,
                "MASTER_PORT": port,
                "RANK": str(rank),
                "WORLD_SIZE": str(world),
                **rank_env.get(rank, {}),
            }
            cmd = [
                *rank_prefix.get(rank, []),
                sys.executable,
                "-m",
                "piper_sim.torch_backend.rank_main",
                str(spec_path),
            ]
            with open(logs / f"rank{rank}.log", "w") as log, children_ignore_interrupts():
                procs.append(
                    subprocess.Popen(
                        cmd,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        preexec_fn=preexec_rank,
                    )
                )
        _watch(procs, logs, timeout_s)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def launch_in_namespaces(
    target: str,
    args: tuple,
    rank_map: dict[int, tuple[str, str]],
    out_dir: Path,
    *,
    timeout_s: float,
    env: dict[str, str] | None = None,
) -> None:
    """Run target on one process per testbed rank, each inside its node's network namespace, gloo over the
    node's eth0. rank_map: rank -> (namespace, ip), as `Testbed.rank_map` gives it; env: added to every rank's."""
    launch_processes(
        target,
        args,
        len(rank_map),
        out_dir,
        timeout_s=timeout_s,
        master_addr=rank_map[0][1],
        rank_env={r: {"GLOO_SOCKET_IFNAME": "eth0", **(env or {})} for r in rank_map},
        rank_prefix={r: ["ip", "netns", "exec", ns] for r, (ns, _ip) in rank_map.items()},
    )


def _watch(procs: list[subprocess.Popen], logs: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        codes = [p.poll() for p in procs]
        failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            rank, code = failed[0]
            why = f"signal {-code}" if code < 0 else f"exit status {code}"
            raise PiperError(
                f"run: rank {rank} died ({why}); all ranks were stopped. "
                f"Last log line: {_last_line(logs / f'rank{rank}.log')}"
            )
        if all(c == 0 for c in codes):
            return
        if time.monotonic() > deadline:
            stuck = [r for r, c in enumerate(codes) if c is None]
            raise PiperError(f"run: ranks {stuck} did not finish within {timeout_s:.0f} s; all ranks were stopped")
        time.sleep(0.2)


def _last_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()] if path.exists() else []
    return lines[-1].strip() if lines else "(no output)"

"""The fuzz harness: `python tests/fuzz/run.py --cases N [--seed S] [--jobs J] [--show]`.

Generates N seeded cases (cases.py), runs each as `python -m piper_sim.cli ...` in a folder of its own with a time
limit, classifies it and prints the counts per outcome:
  clean      an invalid input refused with one short line naming the user's key (exit 2)
  ok         a valid input accepted (exit 0)
  traceback  a Python traceback or a crash
  hang       still running at the time limit
  accepted   an invalid input accepted (exit 0): a silent wrong answer
  rejected   a valid input refused
  unclear    refused, but not with one short line naming the key
Everything but clean and ok is a defect; the exit status is 1 when there is one.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cases import ROOT, Case, generate, needs_reference  # noqa: E402

DEFECTS = ("traceback", "hang", "accepted", "rejected", "unclear")
MAX_ERROR_CHARS = 400


@dataclass
class Outcome:
    case: Case
    kind: str
    returncode: int | None
    detail: str
    wall_s: float


def environment() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PIPER_SIM_HOME=str(ROOT), PYTHONWARNINGS="ignore")
    env.pop("PYTHONHASHSEED", None)
    return env


def command(argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "piper_sim.cli", *argv]


def make_reference(folder: Path, timeout_s: float) -> None:
    """The run folders `compare` cases start from: two simulations of tiny-moe and one of small-moe."""
    for name, argv in (
        ("sim", ["simulate", "tiny-moe"]),
        ("sim2", ["simulate", "tiny-moe", "--set", "sim.seed=1"]),
        ("other", ["simulate", "small-moe"]),
    ):
        subprocess.run(
            command([*argv, "--out", str(folder / name)]),
            env=environment(),
            check=True,
            capture_output=True,
            timeout=timeout_s,
        )


def prepare(case: Case, folder: Path, shared: Path | None) -> None:
    folder.mkdir(parents=True)
    for rel, source in case.copies.items():
        shutil.copytree(shared / source, folder / rel)
    for rel in case.removes:
        (folder / rel).unlink()
    for rel, content in case.files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if content is None:
            path.mkdir()
        else:
            path.write_bytes(content)


def error_text(stderr: str) -> str:
    """From the first error line on: `piper-sim: error: ...` or argparse's `piper-sim CMD: error: ...`."""
    lines = stderr.rstrip("\n").splitlines()
    for i, line in enumerate(lines):
        if line.startswith("piper-sim") and ": error: " in line:
            return "\n".join(lines[i:])
    return ""


def classify(case: Case, returncode: int | None, stderr: str) -> tuple[str, str]:
    if returncode is None:
        return "hang", ""
    if "Traceback (most recent call last)" in stderr or returncode not in (0, 1, 2):
        return "traceback", stderr.strip().splitlines()[-1][:300] if stderr.strip() else f"exit {returncode}"
    if returncode == 0:
        return ("accepted", "exit 0") if case.invalid else ("ok", "")
    error = error_text(stderr)
    if case.invalid is False:
        return "rejected", (error or stderr.strip())[:300]
    if not error or "\n" in error or len(error) > MAX_ERROR_CHARS:
        return "unclear", (error or stderr.strip())[:300].replace("\n", "\\n")
    if case.invalid and case.key and case.key.lower() not in error.lower():
        return "unclear", f"does not name {case.key!r}: {error[:300]}"
    return "clean", error


def run_case(case: Case, folder: Path, shared: Path | None, timeout_s: float) -> Outcome:
    prepare(case, folder, shared)
    start = time.perf_counter()
    proc = subprocess.Popen(
        command(case.argv),
        cwd=folder,
        env=environment(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=True,
    )  # a group of its own: a hang's ranks are stopped with it
    try:
        _, stderr = proc.communicate(timeout=timeout_s)
        returncode: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate()
        returncode = None
    kind, detail = classify(case, returncode, stderr)
    shutil.rmtree(folder, ignore_errors=True)
    return Outcome(case, kind, returncode, detail, time.perf_counter() - start)


def run_cases(cases: list[Case], *, jobs: int = 2, timeout_s: float = 60.0, progress: bool = False) -> list[Outcome]:
    with tempfile.TemporaryDirectory(prefix="piper-fuzz-") as tmp:
        root = Path(tmp)
        shared = None
        if needs_reference(cases):
            shared = root / "shared"
            make_reference(shared / "ref", timeout_s)
        outcomes: list[Outcome] = []
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = [
                pool.submit(run_case, case, root / f"case{i}", shared, timeout_s) for i, case in enumerate(cases)
            ]
            for i, future in enumerate(futures):
                outcomes.append(future.result())
                if progress:
                    o = outcomes[-1]
                    mark = "!!" if o.kind in DEFECTS else "  "
                    print(
                        f"{mark} [{i + 1}/{len(cases)}] {o.kind:9s} {o.wall_s:5.1f}s {o.case.label()[:90]}",
                        file=sys.stderr,
                        flush=True,
                    )
    return outcomes


def summary(outcomes: list[Outcome]) -> str:
    counts = Counter(o.kind for o in outcomes)
    order = ("clean", "ok", *DEFECTS)
    return f"{len(outcomes)} cases: " + ", ".join(f"{counts.get(k, 0)} {k}" for k in order)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=100, help="number of cases (default 100)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generator (default 0)")
    parser.add_argument("--jobs", type=int, default=2, help="cases run at once (default 2)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds before a case counts as a hang")
    parser.add_argument("--progress", action="store_true", help="a line per finished case on stderr")
    args = parser.parse_args(argv)
    outcomes = run_cases(
        generate(args.cases, args.seed), jobs=args.jobs, timeout_s=args.timeout, progress=args.progress
    )
    for o in outcomes:
        if o.kind in DEFECTS:
            print(
                f"{o.kind:9s} {o.case.label()}\n          piper-sim {' '.join(o.case.argv)[:200]}\n          {o.detail}"
            )
    print(summary(outcomes))
    return 1 if any(o.kind in DEFECTS for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())

"""Scale: 1,000 live local sandboxes at once, and 10,000 simulated ones on FakeBackend.

1. Local backend (``--quick``: 100). Baseline in the same run: the same number of
   bare ``python3 -I`` host processes started at the same concurrency and kept
   idle (the cheapest thing a sandbox agent could be). Then, through a Session and
   ``cwa.gather(limit=16)``:

   - create N sandboxes, all kept alive: creation rate, latency, failures;
   - with all alive and idle: memory per sandbox, the PSS (and USS, RSS) summed over
     every process of every sandbox (bwrap, agent, workers) divided by N, by role;
     the kernel's side from /proc/meminfo (page tables, kernel stacks, slab) and
     MemAvailable, system-wide (noisy on a shared machine); the driver's RSS growth,
     its threads (asyncio's ThreadedChildWatcher holds one per child on 3.11) and fds;
   - ``exec(["true"])`` in every sandbox, all alive, twice (the first also makes each
     agent fork a spare worker); memory again, 2 s later and once idle workers are trimmed;
   - stop them all; then check every sandbox process is gone, every cgroup and
     registry entry removed, and the driver's fds and threads back to baseline.

2. FakeBackend (zero latency; ``--quick``: 1,000 instead of 10,000): the CPU time
   (``time.process_time``) the orchestration spends per create, exec and destroy
   with all N alive at once (Session + gather), and per lease of a fresh sandbox
   from ``SandboxPool(reuse=False)`` (create + exec + destroy) through ``cwa.gather``;
   baseline: the same calls made directly on the backend from bare asyncio tasks.

Writes benchmarks/out/scale.json.

    python -m benchmarks.bench_scale [--quick] [--n N] [--sim N] [--no-local] [--no-fake]
"""

from __future__ import annotations

import argparse
import gc
from typing import Any

import anyio

from . import _procstat as ps
from ._common import write_json
from ._scale_fake import fake_scale
from ._scale_local import local_scale


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 local sandboxes, 1,000 simulated")
    parser.add_argument("--n", type=int, default=None, help="local sandboxes alive at once (default 1000)")
    parser.add_argument("--sim", type=int, default=None, help="simulated sandboxes (default 10000)")
    parser.add_argument("--no-local", action="store_true", help="skip the local backend part")
    parser.add_argument("--no-fake", action="store_true", help="skip the FakeBackend part")
    parser.add_argument(
        "--child-watcher",
        choices=("default", "pidfd"),
        default="default",
        help="pidfd: asyncio's PidfdChildWatcher instead of a thread per child (Python < 3.12)",
    )
    args = parser.parse_args()
    n_local = args.n or (100 if args.quick else 1000)
    n_fake = args.sim or (1000 if args.quick else 10_000)
    ps.raise_nofile()
    results: dict[str, Any] = {"quick": args.quick, "limits": ps.limits()}
    headline: dict[str, Any] = {}
    print(f"limits: {results['limits']}", flush=True)
    if not args.no_local:
        local = anyio.run(local_scale, n_local, args.child_watcher)
        results["local"] = local
        headline.update(local["headline"])
    if not args.no_fake:
        gc.collect()
        fake = anyio.run(fake_scale, n_fake)
        results["fake"] = fake
        headline.update(fake["headline"])
    results["headline"] = headline
    path = write_json("scale", results)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

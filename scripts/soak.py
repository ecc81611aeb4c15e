"""`make soak`: the rebalance scenarios of tests/test_workers_rebalance.py, many times, with big backlogs and
membership changes at random moments; prints each run's outcome and the count of runs passed.

    .venv/bin/python scripts/soak.py [--runs N | --minutes M] [--events 300000] [--tenants 60] [--batch 5000]

Needs KEEL_KAFKA_BOOTSTRAP and KEEL_REDIS_URL (real services); each run uses a fresh cartridge name.
Exit 0 when every run passed, 1 otherwise (failed runs' logs are kept under --keep)."""
from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]     # as pytest's pythonpath


def main() -> int:
    from support.rebalance import SCENARIOS, Size, run_scenario
    from support.workers import services_env

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=0, help="number of runs (default: until --minutes pass)")
    p.add_argument("--minutes", type=float, default=30.0, help="run scenarios until this much time passed")
    p.add_argument("--events", type=int, default=300_000)
    p.add_argument("--tenants", type=int, default=60)
    p.add_argument("--batch", type=int, default=5000)
    p.add_argument("--scenario", choices=SCENARIOS, action="append", help="only these (repeatable)")
    p.add_argument("--seed", type=int, default=int(time.time()))
    p.add_argument("--keep", type=Path, default=Path(tempfile.gettempdir()) / "keel-soak-failures")
    args = p.parse_args()
    env = services_env()
    rng = random.Random(args.seed)
    size = Size(args.events, args.tenants, args.batch, drain_timeout_s=max(600.0, args.events / 200))
    kinds = args.scenario or list(SCENARIOS)
    deadline = time.monotonic() + args.minutes * 60
    passed = failed = 0
    while (passed + failed < args.runs) if args.runs else time.monotonic() < deadline:
        kind = kinds[(passed + failed) % len(kinds)]
        seed = rng.randrange(1 << 30)
        tmp = Path(tempfile.mkdtemp(prefix=f"keel-soak-{kind}-"))
        started = time.monotonic()
        try:
            run_scenario(kind, tmp, env, size, seed, log=lambda m: print(f"  {m}", flush=True))
        except Exception as e:   # noqa: BLE001 - a failed run is counted and kept, the soak goes on
            failed += 1
            dest = args.keep / tmp.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(tmp, dest, ignore=shutil.ignore_patterns("*.jsonl"))
            (dest / "error.txt").write_text("".join(traceback.format_exception(e)))
            print(f"run {passed + failed}: {kind} seed {seed} FAILED after {time.monotonic() - started:.0f}s "
                  f"(logs in {dest}): {str(e).splitlines()[0] if str(e) else type(e).__name__}", flush=True)
        else:
            passed += 1
            print(f"run {passed + failed}: {kind} seed {seed} passed in {time.monotonic() - started:.0f}s", flush=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"soak: {passed} of {passed + failed} run(s) passed ({args.events} events over {args.tenants} tenants "
          f"per run, batch {args.batch})")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

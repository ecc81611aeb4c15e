"""A bench script of another checkout, run in the same invocation as this one's (`--baseline REF`).

    from baseline import Baseline
    base = Baseline("76cd00d")                 # a git ref of this repository; 76cd00d is the default
    text = base.run("bench/redis_layouts.py", ["--events", "20000", "--rounds", "1"])

The checkout is a `git worktree` of the ref's commit (detached) in the system's temporary folder
(`<tmp>/keel-baseline-<commit>`, outside the repository), made on first use and reused while it is at that
commit. Its scripts run as subprocesses with this project's interpreter (.venv/bin/python), the worktree as
working folder and first on PYTHONPATH, so that `keel`, `workers` and the bench modules they import are the
checkout's, not this tree's (checked once per checkout: `keel.__file__` must be inside it). KEEL_REDIS_LAYOUT
is dropped from the environment the script inherits (a script of a checkout with layouts sets its own).

The default ref, 76cd00d, is main before layout 1's removal (issue 23): both key layouts and
bench/redis_layouts.py, which measures them side by side.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_REF = "76cd00d"


class BaselineFailed(RuntimeError):
    """The baseline checkout could not be made, or its script failed (the message holds its output's tail)."""


def _git(*args: str, cwd: Path = ROOT) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise BaselineFailed(f"git {' '.join(args)} failed: {proc.stderr.strip()[-500:]}")
    return proc.stdout.strip()


def interpreter() -> str:
    """This project's interpreter (its .venv), else the one running now."""
    venv = ROOT / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


class Baseline:
    """A checkout of `ref` (made on first use) whose bench scripts can be run."""

    def __init__(self, ref: str = DEFAULT_REF, *, parent: Path | None = None) -> None:
        self.ref = ref
        self.commit = _git("rev-parse", "--verify", f"{ref}^{{commit}}")
        self.path = Path(parent or tempfile.gettempdir()) / f"keel-baseline-{self.commit[:12]}"
        self._checked = False

    def __str__(self) -> str:
        return f"{self.ref} ({self.commit[:9]}, worktree {self.path})"

    def checkout(self) -> Path:
        """The worktree at the ref's commit: reused when it is there already, else made (again)."""
        if (self.path / ".git").exists():
            try:
                if _git("rev-parse", "HEAD", cwd=self.path) == self.commit:
                    return self.path
            except BaselineFailed:
                pass
            _git("worktree", "remove", "--force", str(self.path))
        _git("worktree", "prune")           # a worktree deleted without git (a cleaned /tmp) is forgotten first
        _git("worktree", "add", "--detach", "--force", str(self.path), self.commit)
        return self.path

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "KEEL_REDIS_LAYOUT"}
        env["PYTHONPATH"] = os.pathsep.join([str(self.path), *filter(None, [os.environ.get("PYTHONPATH")])])
        return env

    def _check(self) -> None:
        """keel and workers are imported from the checkout, not from this tree (an editable install)."""
        if self._checked:
            return
        out = subprocess.run([interpreter(), "-c", "import keel, workers; print(keel.__file__); print(workers.__file__)"],
                             cwd=self.path, env=self.env(), capture_output=True, text=True, check=False)
        files = [Path(line).resolve() for line in out.stdout.split()]
        if out.returncode or len(files) != 2 or not all(f.is_relative_to(self.path.resolve()) for f in files):
            raise BaselineFailed(f"the baseline checkout's packages are not the ones imported: {out.stdout.strip()} "
                                 f"{out.stderr.strip()[-300:]}")
        self._checked = True

    def run(self, script: str, args: list[str], *, prelude: str = "", timeout: float = 3600) -> str:
        """The stdout of `script` (a path relative to the checkout's root) run with `args` in the checkout;
        raises BaselineFailed when it exits with an error. `prelude`, Python source, runs first in the same
        interpreter (to mend what the checkout's script needs of its own code and no longer finds there; the
        caller says what and why)."""
        tree = self.checkout()
        self._check()
        command = [str(tree / script)]
        if prelude:
            command = ["-c", (f"import runpy, sys\n{prelude}\nsys.argv[0] = {str(tree / script)!r}\n"
                              "runpy.run_path(sys.argv[0], run_name='__main__')")]
        proc = subprocess.run([interpreter(), *command, *args], cwd=tree, env=self.env(),
                              capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode:
            raise BaselineFailed(f"{script} of {self} exited {proc.returncode}:\n{proc.stdout[-1500:]}\n"
                                 f"{proc.stderr[-2500:]}")
        return proc.stdout


def ratio(a: float | None, b: float | None) -> str:
    """a / b with two decimals, or "-" when either is missing or b is 0."""
    return "-" if a is None or not b else f"{a / b:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description="Make (or reuse) the baseline checkout of REF and say where it is.")
    ap.add_argument("ref", nargs="?", default=DEFAULT_REF, help=f"a git ref (default {DEFAULT_REF})")
    base = Baseline(ap.parse_args().ref)
    base.checkout()
    base._check()
    print(base)


if __name__ == "__main__":
    main()

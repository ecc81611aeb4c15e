"""The suite's slow tiers agree in the three places that name them: tests/conftest.py gives the markers
(TIERS), pyproject.toml declares them, and the Makefile's `test-fast` leaves out exactly those tiers while
`make test` selects none away. Both run on pytest-xdist workers grouped so that each serial tier runs one test
at a time (tests/conftest.py: SERIAL_TIERS, xdist_group_of)."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

from conftest import ONE_WORKER_MODULES, SERIAL_TIERS, TIERS, _rank, tiers_of, xdist_group_of

ROOT = Path(__file__).resolve().parents[1]


def declared_markers() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    return {line.split(":")[0].strip() for line in config["markers"]}


def make_variable(name: str) -> str:
    found = re.search(rf"^{name}\s*:=\s*(.*)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert found, f"no {name} in the Makefile"
    return found.group(1).strip()


def test_every_tier_is_declared_and_each_of_its_places_exists() -> None:
    assert set(TIERS) <= declared_markers()
    for tier, places in TIERS.items():
        for place in places:
            path = ROOT / place.split("::")[0]
            assert path.exists(), f"{tier}: {place} names no file"
            if "::" in place:
                cls = place.split("::")[1]
                assert re.search(rf"^class {cls}\b", path.read_text(), re.MULTILINE), f"{tier}: no class {cls}"


def test_test_fast_leaves_out_exactly_the_tiers_and_make_test_keeps_them() -> None:
    assert set(make_variable("SLOW_TIERS").split(" or ")) == set(TIERS)
    recipe = re.search(r"^test-fast:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert recipe and '-m "not ($(SLOW_TIERS))"' in recipe.group(1)
    whole = re.search(r"^test:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.MULTILINE)
    run = whole and re.search(r"python -m pytest \$\(PARALLEL\)(.*)$", whole.group(1), re.MULTILINE)
    assert run and " -m " not in run.group(1).split("#")[0]     # every tier: options, but no marker selection
    assert make_variable("PARALLEL").startswith("-n ")       # on xdist workers, grouped by xdist_group_of


def test_each_serial_tier_is_one_xdist_group_and_the_other_tests_none() -> None:
    assert set(SERIAL_TIERS) <= set(TIERS)
    assert xdist_group_of("tests/faults/test_faults.py::test_x") == "tier:faults"
    assert xdist_group_of("tests/faults/test_sentinel.py::test_w") == "tier:faults"
    assert xdist_group_of("tests/deploy/test_stack.py::test_y[a]") == "tier:deploy"
    assert xdist_group_of("tests/test_workers_rebalance.py::test_z[join]") == "tier:rebalance"
    assert xdist_group_of("tests/test_store_redis.py::TestRedisStore::test_timeline_matches") is None
    for module in ONE_WORKER_MODULES:
        assert (ROOT / module).is_file(), module
        assert xdist_group_of(f"{module}::test_a") == xdist_group_of(f"{module}::test_b[1]") == module


def test_the_scheduler_hands_out_the_serial_tiers_then_the_one_worker_modules_then_single_tests() -> None:
    units = ["tests/test_a.py::test_x", ONE_WORKER_MODULES[0], "tier:rebalance", "tests/test_b.py::test_y", "tier:deploy"]
    assert sorted(units, key=_rank) == ["tier:rebalance", "tier:deploy", ONE_WORKER_MODULES[0],
                                        "tests/test_a.py::test_x", "tests/test_b.py::test_y"]


def test_a_test_is_in_the_tier_of_its_place() -> None:
    assert tiers_of("tests/faults/test_faults.py::test_x") == ["faults"]
    assert tiers_of("tests/deploy/test_stack.py::test_y[a]") == ["deploy"]
    assert tiers_of("tests/test_workers_rebalance.py::test_z[join]") == ["rebalance"]
    assert tiers_of("tests/test_store_redis.py::TestRedisStoreRollingEveryStep::"
                    "test_random_writes_equal_the_memory_store[1]") == ["rolling_segments"]
    assert tiers_of("tests/test_store_redis.py::TestRedisStoreRollingEveryStep::test_timeline_matches") == []
    assert tiers_of("tests/test_store_redis.py::TestRedisStore::test_random_writes_equal_the_memory_store[1]") == []
    assert tiers_of("tests/test_architecture.py::test_no_import_circle_in_the_core") == []

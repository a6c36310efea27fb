"""The lanes of tests/conftest.py: each test in one lane, set by its place, and a fast-lane test that
starts a process (a real sandbox is one) fails, even if the code under test caught the refusal.

The suite's own conftest runs here on small test files in a temporary directory (pytester, in this
process), so the files' names pick their lanes as in tests/.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = (Path(__file__).resolve().parent / "conftest.py").read_text(encoding="utf-8")

SPAWNS = """
import subprocess, sys

def test_spawns():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

def test_spawns_and_swallows_the_refusal():
    try:
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    except AssertionError:
        pass

def test_pure():
    assert 1 + 1 == 2
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    markers = "markers =\n    fast: f\n    e2e: e\n    slow: s\n"
    pytester.makeini("[pytest]\naddopts = -p no:looptime_plugin -p no:cacheprovider\n" + markers)
    return pytester


def test_a_fast_test_that_starts_a_process_fails(suite: pytest.Pytester) -> None:
    suite.makepyfile(**{"pool/test_lane_spawns": SPAWNS})  # a fast place (names unlike the suite's own)
    result = suite.runpytest_inprocess("-m", "fast")
    # test_spawns fails (and errors at teardown); the swallowed refusal errors at teardown
    result.assert_outcomes(passed=2, failed=1, errors=2)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_spawns_and_swallows_the_refusal*"])
    result.stdout.fnmatch_lines(["*a fast-lane test started a process*"])


def test_the_same_test_in_an_e2e_place_may(suite: pytest.Pytester) -> None:
    suite.makepyfile(**{"local/test_lane_spawns_e2e": SPAWNS})  # an e2e place
    result = suite.runpytest_inprocess("-m", "e2e")
    result.assert_outcomes(passed=3)
    assert suite.runpytest_inprocess("-m", "fast").ret == pytest.ExitCode.NO_TESTS_COLLECTED


def test_places_and_markers_pick_one_lane(suite: pytest.Pytester) -> None:
    suite.makepyfile(
        **{
            "pool/test_lane_place": "import pytest\n\ndef test_a():\n    pass\n\n"
            "@pytest.mark.e2e\ndef test_b():\n    pass\n",
            "pool/test_lane_soak": "import pytest\n\n@pytest.mark.slow\ndef test_soak():\n    pass\n",
        }
    )
    result = suite.runpytest_inprocess("-m", "fast", "-v")
    result.stdout.fnmatch_lines(["*test_lane_place.py::test_a PASSED*"])
    result.assert_outcomes(passed=1)
    result = suite.runpytest_inprocess("-m", "e2e", "-v")
    result.stdout.fnmatch_lines(["*test_lane_place.py::test_b PASSED*"])
    result.assert_outcomes(passed=1)
    result = suite.runpytest_inprocess("-m", "slow", "-v")
    result.stdout.fnmatch_lines(["*test_lane_soak.py::test_soak PASSED*"])
    result.assert_outcomes(passed=1)

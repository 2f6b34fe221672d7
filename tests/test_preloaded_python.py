"""The tests' rank launcher (``preloaded_python.run_python``): a group that does not finish
in time is reported with what each rank left, so that a hang in CI says where it waited."""

from __future__ import annotations

import pytest

from preloaded_python import run_python

WAITS = """
import sys, time
if sys.argv[1] == "0":
    raise RuntimeError("rank 0 could not start")
def waiting_for_rank_0():
    time.sleep(600)
waiting_for_rank_0()
"""


def test_a_rank_left_waiting_is_reported_with_its_stack_and_the_others_error():
    with pytest.raises(TimeoutError) as e:
        run_python(WAITS, [["0"], ["1"]], timeout=3)
    text = str(e.value)
    assert text.startswith("ranks [1] of 2 still running after 3 s")
    assert "--- rank 0 (exit code 1)" in text and "RuntimeError: rank 0 could not start" in text
    assert "--- rank 1 (was still running)" in text and "waiting_for_rank_0" in text

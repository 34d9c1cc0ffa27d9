"""tools/bench_async.py's arithmetic and placement: the ratio over max(rollout alone, update alone), the figure a
no-overlap step must give (the negative control), the speed-up, the ABBA order of runs, and pinning a thread
to a core at a nice value. Checked against values worked out by hand, and against steps built from the
definitions (a perfect overlap takes max(r, u), no overlap r + u)."""

import importlib.util
import os
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))  # bench_async imports benchstats from its own directory
spec = importlib.util.spec_from_file_location("bench_async", ROOT / "tools" / "bench_async.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_ratio_is_step_over_the_larger_of_rollout_and_update():
    assert bench.ratios([2.0, 3.0, 4.0], 1.0, 2.0) == [1.0, 1.5, 2.0]
    assert bench.ratios([0.6], 0.6, 0.2) == [1.0]
    with pytest.raises(ValueError, match="positive"):
        bench.ratios([1.0], 0.0, 0.0)


@pytest.mark.parametrize(("r", "u"), [(0.5, 1.0), (1.0, 1.0), (2.0, 0.3)])
def test_the_control_separates_no_overlap_from_overlap(r, u):
    serial, overlapped = [r + u] * 5, [max(r, u)] * 5  # the two bounds, by definition
    assert bench.ratios(serial, r, u) == pytest.approx([bench.no_overlap(r, u)] * 5)
    assert bench.ratios(overlapped, r, u) == pytest.approx([1.0] * 5)
    assert bench.no_overlap(r, u) == pytest.approx(1 + min(r, u) / max(r, u))  # 2 at equal shares
    assert bench.speedup(serial, overlapped) == pytest.approx((r + u) / max(r, u))


def test_runs_alternate_order_each_round():
    assert bench.order(["a", "b", "c"], 3) == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]


def test_table_rows_use_the_sync_medians():
    rows = {
        "sync": {"step": [3.0] * 5, "rollout": [1.0] * 5, "update": [2.0] * 5},
        "k=1": {"step": [2.0] * 5, "rollout": [1.5] * 5, "update": [2.0] * 5},  # overlapped: 2 of 3.5
        "serial": {"step": [3.0] * 5, "rollout": [1.0] * 5, "update": [2.0] * 5},  # one after the other
    }
    lines = bench.table(rows)
    assert "no overlap would give 1.50" in lines[0]
    sync = "| sync | 3.000 [3.000-3.000] | 1.000 [1.000-1.000] | 2.000 [2.000-2.000] | 1.00 [1.00-1.00] "
    assert lines[3] == sync + "| 1.50 [1.50-1.50] | 1.00x |"
    assert lines[4].endswith("| 0.57 [0.57-0.57] | 1.00 [1.00-1.00] | 1.50x |")
    assert lines[5].endswith("| 1.00 [1.00-1.00] | 1.50 [1.50-1.50] | 1.00x |")


def test_timed_adds_each_calls_wall_time():
    into = [0.0]
    assert bench.timed(lambda x: x + 1, into)(1) == 2
    assert into[-1] > 0


def test_place_pins_a_thread_and_sets_its_nice():
    done, seen = threading.Event(), {}

    def worker():
        tid = threading.get_native_id()
        nice = os.getpriority(os.PRIO_PROCESS, tid) + 1  # raising a nice value needs no privilege
        core = min(os.sched_getaffinity(0))
        seen["ok"] = bench.place([tid], core, nice)
        seen["affinity"], seen["nice"] = os.sched_getaffinity(tid), os.getpriority(os.PRIO_PROCESS, tid)
        seen["wanted"] = ({core}, nice)
        done.set()

    thread = threading.Thread(target=worker)  # its own thread: the test process keeps its placement
    thread.start()
    thread.join()
    assert done.is_set() and seen["ok"]
    assert (seen["affinity"], seen["nice"]) == seen["wanted"]

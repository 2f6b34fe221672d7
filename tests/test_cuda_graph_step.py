"""``train.cuda_graphs`` (``cuda_graph_step.py``) on a CPU: what a CPU can check. The capture
itself needs CUDA; here a stand-in graph records which step and which static buffers a
capture would hold, and replays by running that step on those buffers. Checked: the
shape-keyed cache (task and every tensor's shape and dtype), the eager first run of a shape
never met, the capture on its second, replays after that with the batch copied into the same
static buffers, the host's part around each (``prepare`` before every step, ``advance``
after a replay only), and the refusal off CUDA in one line."""

from __future__ import annotations

import torch

from vlp.contract import batch_spec as bs
from vlp.platform.training.cuda_graph_step import GraphedSteps, check, shape_key


class StandInGraph:
    """What ``CudaGraph`` holds: the step and its static inputs; replay runs it on them."""

    made: list["StandInGraph"] = []

    def __init__(self, step, static, pool):
        self.step, self.static, self.pool = step, static, pool
        StandInGraph.made.append(self)

    def replay(self):
        return self.step(self.static)


def batch(rows: int, fill: float) -> dict:
    return {"x": torch.full((rows, 4), fill), "ids": torch.arange(rows),
            "nested": {"m": torch.full((rows,), fill)}, "name": "plain"}


def test_each_shape_runs_eager_once_then_is_captured_then_replayed():
    calls, events = [], []

    def step(task, b):
        calls.append((task, b["x"].data_ptr(), float(b["x"][0, 0]), float(b["nested"]["m"][0])))
        return {"loss": b["x"].sum()}

    StandInGraph.made.clear()
    steps = GraphedSteps(step, prepare=lambda: events.append("prepare"),
                         advance=lambda: events.append("advance"), make_graph=StandInGraph,
                         pool="pool")
    first = batch(3, 1.0)
    assert steps("mlm", first)["loss"] == 12.0           # eager, on the batch itself
    assert calls[-1] == ("mlm", first["x"].data_ptr(), 1.0, 1.0) and not StandInGraph.made
    assert events == ["prepare"]

    second = batch(3, 2.0)
    assert steps("mlm", second)["loss"] == 24.0          # captured, on a clone, then replayed
    graph = StandInGraph.made[0]
    static = graph.static["x"]
    assert static.data_ptr() != second["x"].data_ptr() and graph.pool == "pool"
    assert events == ["prepare", "prepare"]               # the capture moved the host itself

    third = batch(3, 5.0)
    assert steps("mlm", third)["loss"] == 60.0           # replayed: copied into the buffers
    assert graph.static["x"].data_ptr() == static.data_ptr()
    assert calls[-1] == ("mlm", static.data_ptr(), 5.0, 5.0)
    assert graph.static["name"] == "plain"
    assert events == ["prepare"] * 3 + ["advance"]
    assert len(StandInGraph.made) == 1

    # another shape, or the same shape of another task: eager first, a graph of its own next
    steps("mlm", batch(4, 1.0))
    steps("itm", batch(3, 1.0))
    assert len(StandInGraph.made) == 1
    steps("itm", batch(3, 7.0))
    assert len(StandInGraph.made) == 2 and float(StandInGraph.made[1].static["x"][0, 0]) == 7.0
    assert dict(steps.counts) == {"eager": 3, "captured": 2, "replayed": 1}


def test_the_key_is_the_task_and_every_tensors_shape_and_dtype():
    a = batch(3, 1.0)
    assert shape_key("mlm", a) == shape_key("mlm", batch(3, 9.0))
    assert shape_key("mlm", a) != shape_key("itm", a)
    assert shape_key("mlm", a) != shape_key("mlm", batch(2, 1.0))
    half = dict(a, x=a["x"].bfloat16())
    assert shape_key("mlm", a) != shape_key("mlm", half)
    nested = dict(a, nested={"m": torch.zeros(5)})
    assert shape_key("mlm", a) != shape_key("mlm", nested)


def test_the_key_holds_what_the_model_decides_from_the_host_integers():
    """The packed row length and whether any row is padded (the model's width and its
    padding mask, both fixed in a capture) are in the key: two batches with the same tensor
    shapes and another row length, or padded against full, do not replay one graph. The
    real units alone (both padded) do not part them."""
    def packed(row: int, real: int) -> dict:
        return {bs.INPUT_IDS: torch.zeros(4, 8, dtype=torch.long), bs.ROW_LENGTH: row,
                bs.REAL_UNITS: real}

    base = shape_key("mlm", packed(20, 70))
    assert shape_key("mlm", packed(20, 71)) == base          # padded both: one graph
    assert shape_key("mlm", packed(21, 70)) != base          # a longer packed row
    assert shape_key("mlm", packed(20, 80)) != base          # 4 rows × 20: no padding
    summed = {"task_batches": {"mlm": packed(20, 70), "itm": packed(20, 80)}}
    other = {"task_batches": {"mlm": packed(20, 70), "itm": packed(20, 79)}}
    assert shape_key("mlm+itm", summed) != shape_key("mlm+itm", other)


def test_refused_off_cuda_and_where_the_capture_is_not_yet_right_in_one_line():
    reason = check(torch.device("cpu"), 1, 1, True)
    assert reason.startswith("train.cuda_graphs: needs a CUDA device") and "cpu" in reason
    assert "\n" not in reason
    cuda = torch.device("cuda", 0)
    assert check(cuda, 1, 1, True) is None
    assert "grad_accum is 2" in check(cuda, 2, 1, True)
    assert "2 workers" in check(cuda, 1, 2, True)
    assert "device step" in check(cuda, 1, 1, False)
    assert "on_nonfinite" in check(cuda, 1, 1, True, "skip")

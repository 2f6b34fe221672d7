"""The global pretraining stream (``data.stream: global``), without Ray or DeepSpeed: W ranks
each reading the whole tiny world train, between them, exactly the batches one worker cuts
(byte for byte: examples, masking, ITM negatives, fixed shapes), rank r the global indices r,
r + W, ...; a position saved by W ranks continues on another number of ranks with no batch
skipped or trained twice, across epoch ends; the task draws follow the global index; a
per-worker checkpoint is refused in one line."""

from __future__ import annotations

import pytest

from test_pretrain_stream import batch_digest
from vlp.datasets.batching.pretrain_batches import PretrainBatches
from vlp.datasets.batching.task_sampler import TaskSampler
from vlp.datasets.stream.data_config import DataConfig, DataConfigError, world_sources
from vlp.datasets.stream.data_plan import plan_data
from vlp.datasets.stream.local_stream import local_batches, local_blocks
from vlp.models import create_model
from vlp.platform.training.global_draws import GlobalDraws

MIX = {"mlm": 2, "itm": 2, "mrfr": 1, "mrc-kl": 1}
GROUP = 2                       # the run's first number of workers: a draw per 2 indices
N = 40                          # global batches compared: ~16 an epoch, so epochs 0-2


def _plan(world, **kw):
    spec = create_model("uniter-tiny", list(MIX), region_feat_dim=64, num_classes=17).preprocess
    cfg = DataConfig.for_model(spec, world_sources(str(world)), batch_units=1024, read_rows=8,
                               bucket_window=256, fixed_shapes=True, **kw)
    return plan_data(cfg, MIX, model=spec)


@pytest.fixture(scope="module")
def plan(tiny_world):
    return _plan(tiny_world, stream="global")


SAMPLER = TaskSampler(MIX, seed=3)


def task_of(g: int) -> str:
    return SAMPLER.draw(g // GROUP)


def stream(plan, rank: int, world: int) -> PretrainBatches:
    return PretrainBatches(plan, local_blocks(plan), rank=rank, world_size=world,
                           global_order=True)


def take(batches: PretrainBatches, first: int, world: int, n: int) -> list[str]:
    """``n`` batches of the rank whose next global index is ``first``, each masked for the
    task of its index."""
    out = [batch_digest(batches.next(task_of(first + j * world))) for j in range(n)]
    return out


@pytest.fixture(scope="module")
def one_worker(plan):
    b = stream(plan, 0, 1)
    try:
        digests = take(b, 0, 1, N)
        assert b.epoch >= 2           # the comparison crosses epoch ends
        return digests
    finally:
        b.close()


def test_ranks_share_one_workers_batches_and_resume_on_another_world(plan, one_worker):
    ranks = [stream(plan, r, 2) for r in range(2)]
    try:
        got = [take(b, r, 2, 5) for r, b in enumerate(ranks)]
        assert got == [one_worker[0:10:2], one_worker[1:10:2]]
        saved = [b.state_dict() for b in ranks]           # a step boundary: index 10
    finally:
        for b in ranks:
            b.close()
    # 2 → 1: continues at global index 10
    one = stream(plan, 0, 1)
    one.load_resharded_state(saved, 2)
    try:
        mid = take(one, 10, 1, 14)
        assert mid == one_worker[10:24]
        back = one.state_dict()
    finally:
        one.close()
    # 1 → 2 at index 24, past an epoch end; then the same on 2 again from the 2's own state
    ranks = [stream(plan, r, 2) for r in range(2)]
    for b in ranks:
        b.load_resharded_state([back], 1)
    try:
        got = [take(b, 24 + r, 2, 3) for r, b in enumerate(ranks)]
        assert got == [one_worker[24:30:2], one_worker[25:30:2]]
        again = [b.state_dict() for b in ranks]
    finally:
        for b in ranks:
            b.close()
    ranks = [stream(plan, r, 2) for r in range(2)]
    try:
        for b, s in zip(ranks, again):
            b.load_state_dict(s)
        got = [take(b, 30 + r, 2, 5) for r, b in enumerate(ranks)]
        assert got == [one_worker[30:40:2], one_worker[31:40:2]]
    finally:
        for b in ranks:
            b.close()


def test_a_per_worker_position_is_refused_in_one_line(tiny_world, plan):
    per_worker = local_batches(_plan(tiny_world), rank=0, world_size=2)
    try:
        per_worker.next("mlm")
        state = per_worker.state_dict()
    finally:
        per_worker.close()
    b = stream(plan, 0, 1)
    with pytest.raises(ValueError) as e:
        b.load_resharded_state([state, state], 2)
    assert "\n" not in str(e.value) and "data.stream: per_worker" in str(e.value)
    assert "resume on 2 workers" in str(e.value)
    with pytest.raises(ValueError) as e:
        b.load_state_dict(state)
    assert "\n" not in str(e.value)
    assert "was data.stream: per_worker, this run's is global" in str(e.value)
    assert local_batches(plan, rank=1, world_size=2).global_order   # the local runner's too


def test_the_text_corpus_stream_is_refused_with_a_global_stream(tiny_world):
    spec = create_model("vlbert-tiny", ["mlm", "mlm-text"], region_feat_dim=64,
                        num_classes=17).preprocess
    cfg = DataConfig.for_model(spec, world_sources(str(tiny_world)), batch_units=1024,
                               stream="global", text_corpus=str(tiny_world))
    with pytest.raises(DataConfigError) as e:
        plan_data(cfg, {"mlm": 1, "mlm-text": 1}, model=spec)
    assert any(key == "stream" and "mlm-text" in msg for key, msg in e.value.problems)


def test_task_draws_follow_the_global_index_on_any_world_that_divides_the_group():
    two = GlobalDraws(TaskSampler(MIX, seed=3), world=2)
    assert [two.next() for _ in range(6)] == [SAMPLER.draw(k) for k in range(6)]  # today's
    state = two.state_dict()
    assert (state["global_micro"], state["task_group"]) == (12, 2)
    one = GlobalDraws(TaskSampler(MIX, seed=3), world=1)
    one.load_state_dict(state)
    assert [one.next() for _ in range(6)] == [task_of(g) for g in range(12, 18)]
    back = GlobalDraws(TaskSampler(MIX, seed=3), world=2)
    back.load_state_dict(one.state_dict())
    assert [back.next() for _ in range(3)] == [task_of(g) for g in range(18, 24, 2)]
    three = GlobalDraws(TaskSampler(MIX, seed=3), world=3)
    with pytest.raises(ValueError) as e:
        three.load_state_dict(state)
    assert "\n" not in str(e.value) and "resume on 1, 2 workers" in str(e.value)
    with pytest.raises(ValueError) as e:
        one.load_state_dict(TaskSampler(MIX, seed=3).state_dict())
    assert "\n" not in str(e.value) and "per_worker" in str(e.value)


def test_a_per_worker_checkpoint_is_refused_on_another_world_before_any_worker_starts():
    """The checkpoint's meta records its stream (``PretrainBatches.state_dict``): a
    per-worker one is refused on another number of workers even where this run's config
    streams globally (the driver's and every worker's ``resume_problem``)."""
    from vlp.platform.training import checkpointing

    meta = {"step": 2, "stage": 0, "tag": "step00000002", "stages": [["one", 4]],
            "world_size": 2, "grad_accum": 1, "zero_stage": 1, "stream": "per_worker"}
    problem = checkpointing.resume_problem(meta, [("one", 4)], 1, reshardable=True)
    assert "\n" not in problem and "the checkpoint's batch stream (data.stream: per_worker)" \
        in problem and "resume on 2 workers" in problem
    assert checkpointing.resume_problem(meta, [("one", 4)], 2, reshardable=True) is None
    assert checkpointing.resume_problem({**meta, "stream": "global"}, [("one", 4)], 1,
                                        reshardable=True) is None


def test_a_builder_that_passes_over_batches_keeps_the_global_order(plan, one_worker):
    """``train.batch_builders`` > 1: each builder builds every n-th batch of its rank and
    passes over the others (``pass_over``): the batches it builds are still the rank's."""
    b = stream(plan, 1, 2)          # rank 1 of 2: global indices 1, 3, 5, 7, ...
    try:
        built = []
        for j in range(8):
            g = 1 + 2 * j
            if j % 2:
                b.pass_over(task_of(g))
            else:
                built.append(batch_digest(b.next(task_of(g))))
        assert built == one_worker[1:17:4]
    finally:
        b.close()

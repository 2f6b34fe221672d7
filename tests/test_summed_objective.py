"""The per-family objective (issue 18, item 3): ``sampled`` trains one task per micro-batch
(UNITER), ``summed`` every task's loss on the same examples with one backward (VL-BERT's
reference code, ImageBERT's "four tasks simultaneously", SOHO's Eq. 9; issue 29). Under
``summed`` each task (or forward group, ``test_paper_objectives.py``) gets its own batch of
the example set, SOHO's negative texts feed ITM only, the total is the weighted sum of the
per-task losses (each still reported under its own key), and a restored stream or loop
continues with the same example sets."""

from __future__ import annotations

import copy
import math
import pickle

import pytest
import torch

from vlp.contract import batch_spec as K
from vlp.contract.config_loader import ConfigError
from vlp.datasets.batching.task_sampler import SummedTasks, TaskSampler, TaskSet, loss_weights
from vlp.datasets.stream.data_config import DataConfig, PixelConfig
from vlp.datasets.stream.data_plan import plan_data
from vlp.datasets.stream.local_stream import local_batches
from vlp.platform.pretrain.experiment_config import load_experiment_config
from vlp.platform.pretrain.run import loop_config, objective_of
from vlp.platform.training import objective
from vlp.platform.training.checkpointing import TrainerState
from vlp.platform.training.prefetch import Prefetcher
from vlp.testing.toy import ToyBatchSource, ToyModel

from test_pipeline_models import sources
from test_platform_prefetch import DeepSpeedLikeEngine
from test_pretrain_stream import batch_digest

CPU = torch.device("cpu")
TOY_MIX = {"mlm": 2.0, "itm": 2.0, "mrfr": 1.0}


def experiment(family: str, *overrides: str):
    return load_experiment_config(overrides=list(overrides), data={
        "data": {"sources": {"a": {"path": "/x"}}}, "model": {"family": family},
        "train": {"steps": 10}, "optimizer": {"warmup_steps": 2}})


# ---- config -------------------------------------------------------------------------------

@pytest.mark.parametrize("family, paper", [
    ("uniter-tiny", "sampled"), ("uniter-base", "sampled"), ("vlbert-tiny", "summed"),
    ("imagebert-tiny", "summed"), ("imagebert-base", "summed"), ("soho-tiny", "summed"),
    ("soho-r18-l3", "summed")])
def test_each_family_defaults_to_its_papers_objective(family, paper):
    cfg = experiment(family)
    assert cfg.train.objective == ""          # unset: the family decides
    assert objective_of(cfg) == paper and loop_config(cfg).train.objective == paper
    other = "sampled" if paper == "summed" else "summed"
    assert loop_config(experiment(family, f"train.objective={other}")).train.objective == other


def test_a_bad_objective_is_one_line_naming_the_key():
    with pytest.raises(ConfigError) as e:
        experiment("soho-tiny", "train.objective=mixed")
    lines = str(e.value).strip().splitlines()
    assert len(lines) == 1 and "train.objective" in lines[0] and "summed" in lines[0], lines


def test_ratios_become_loss_weights_with_mean_one():
    assert loss_weights({"mlm": 1, "itm": 1, "mvm": 1}) == {"mlm": 1.0, "itm": 1.0, "mvm": 1.0}
    w = loss_weights({"mlm": 2, "itm": 2, "mrfr": 1, "mrc-kl": 1, "mrc": 0})
    assert w == pytest.approx({"mlm": 4 / 3, "itm": 4 / 3, "mrfr": 2 / 3, "mrc-kl": 2 / 3})
    draw = SummedTasks({"mlm": 2, "itm": 2, "mrfr": 1}).next()
    assert draw == ("mlm", "itm", "mrfr") and pickle.loads(pickle.dumps(draw)).weights == \
        draw.weights


def test_a_sampler_refuses_the_other_objectives_state():
    summed, sampled = SummedTasks(TOY_MIX), TaskSampler(TOY_MIX)
    with pytest.raises(ValueError, match="train.objective=summed"):
        sampled.load_state_dict(summed.state_dict())
    with pytest.raises(ValueError, match="train.objective=sampled"):
        summed.load_state_dict(sampled.state_dict())


def test_a_task_set_has_an_id_of_its_own_for_the_cross_rank_check():
    ids = {t: i for i, t in enumerate(["mlm", "itm", "mrfr", "mrc"])}
    sets = [TaskSet({"mlm": 1, "itm": 1}), TaskSet({"mlm": 1, "itm": 1, "mrfr": 1}),
            TaskSet({"itm": 1})]
    got = [objective.task_id(t, ids) for t in [*ids, *sets]]
    assert len(set(got)) == len(got)


# ---- the model's side: every task's loss, the weighted total -----------------------------

def summed_source(tiny_world, family: str, mix: dict[str, float], with_ids: bool = False):
    from vlp.models.factory import create_model

    model, spec, _ = create_model(family, tasks=list(mix), region_feat_dim=64, num_classes=17)
    kw = dict(batch_units=512, bucket_window=64)
    if spec.input_kind == "pixels":
        kw.update(pixels=PixelConfig(shorter_side=64, longer_max=64), batch_units=600)
    plan = plan_data(DataConfig.for_model(spec, sources(tiny_world), **kw), mix, model=spec)
    return model, local_batches(plan, with_ids=with_ids)


@pytest.mark.parametrize("family, mix", [
    ("imagebert-tiny", {"mlm": 1, "moc": 1, "mrfr": 1, "itm": 1}),
    ("soho-tiny", {"mlm": 2, "mvm": 1, "itm": 1})])
def test_a_summed_micro_batch_yields_every_tasks_loss_and_their_weighted_sum(
        tiny_world, family, mix):
    model, src = summed_source(tiny_world, family, mix)
    draw = SummedTasks(mix).next()
    batch = src.next(draw)
    src.close()
    assert set(batch[K.TASK_BATCHES]) == set(mix)
    model.eval()            # no dropout
    twin = copy.deepcopy(model)   # SOHO's dictionary is state: both start from the same
    torch.manual_seed(0)
    out = objective.forward(model, batch, draw)
    for t in mix:
        assert math.isfinite(float(out[f"{t}_loss"].detach())), (t, out)
    total = sum(draw.weights[t] * out[f"{t}_loss"] for t in mix)
    assert torch.allclose(out["loss"], total)
    # each task's loss is the one the model gives for that task's own batch
    torch.manual_seed(0)
    for t in draw:
        alone = twin(batch[K.TASK_BATCHES][t], task=t)[f"{t}_loss"]
        assert torch.allclose(out[f"{t}_loss"], alone), t


def test_running_statistics_move_once_per_example_set(tiny_world):
    """SOHO forwards each image once per batch: under summed, the dictionary's moving average
    and BatchNorm's running statistics take the first task's forward only."""
    mix = {"mlm": 1, "mvm": 1, "itm": 1}
    model, src = summed_source(tiny_world, "soho-tiny", mix)
    draw = SummedTasks(mix).next()
    batch = src.next(draw)
    src.close()
    model.train()
    twin = copy.deepcopy(model)
    torch.manual_seed(0)
    objective.forward(model, batch, draw)
    torch.manual_seed(0)
    first = next(iter(draw))
    twin(batch[K.TASK_BATCHES][first], task=first)      # one forward: one update
    state, once = model.state_dict(), twin.state_dict()
    moved = [k for k in state if k.endswith(("embedding", "running_mean", "running_var",
                                             "num_batches_tracked"))]
    assert "backbone.visual.dictionary.embedding" in moved
    assert any(k.endswith("running_mean") for k in moved), moved
    for k in moved:
        assert torch.equal(state[k], once[k]), k
    assert all(m.updates for m in model.modules() if hasattr(m, "updates"))   # restored


def test_sohos_images_go_through_the_cnn_once_per_example_set(tiny_world):
    """The paper forwards each image once per batch: under summed every task's batch holds
    the set's images, the ResNet runs once, and its gradient is the sum of every task's."""
    mix = {"mlm": 1, "mvm": 2, "itm": 1}
    model, src = summed_source(tiny_world, "soho-tiny", mix)
    draw = SummedTasks(mix).next()
    batch = src.next(draw)
    src.close()
    pixels = [b[K.PIXELS] for b in batch[K.TASK_BATCHES].values()]
    assert all(torch.equal(p, pixels[0]) for p in pixels)
    visual = model.backbone.visual
    calls = []
    hook = visual.resnet.register_forward_hook(lambda *a: calls.append(1))
    model.train()
    objective.forward(model, batch, draw)["loss"].backward()
    hook.remove()
    assert len(calls) == 1 and visual.shared_images is None
    model.eval()                 # no dropout, BatchNorm on its running statistics
    model.zero_grad(set_to_none=True)
    twin = copy.deepcopy(model)
    torch.manual_seed(0)
    objective.forward(model, batch, draw)["loss"].backward()
    torch.manual_seed(0)
    for t in draw:               # each task's own forward of the images
        (draw.weights[t] * twin(batch[K.TASK_BATCHES][t], task=t)["loss"]).backward()
    for (name, p), q in zip(visual.named_parameters(), twin.backbone.visual.parameters()):
        if p.grad is not None or q.grad is not None:
            assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-6), name


def test_sohos_negative_texts_enter_only_itm(tiny_world):
    mix = {"mlm": 1, "mvm": 1, "itm": 1}
    _, src = summed_source(tiny_world, "soho-tiny", mix, with_ids=True)
    for _ in range(3):
        batch = src.next(SummedTasks(mix).next())
        itm, mlm, mvm = (batch[K.TASK_BATCHES][t] for t in ("itm", "mlm", "mvm"))
        assert (~itm[K.POSITIVE]).any() and (itm[K.ITM_LABELS] == itm[K.POSITIVE].long()).all()
        for masked in (mlm, mvm):      # the true pairs of the set, no negative text
            assert masked[K.POSITIVE].all()
            assert (masked["example_text_key"] == masked["example_image_key"]).all()
            assert sorted(masked["example_text_key"].tolist()) == sorted(
                itm["example_text_key"][itm[K.POSITIVE]].tolist())
        # the set is counted once, as its whole: ITM's batch
        assert int(batch[K.NUM_EXAMPLES]) == len(itm[K.POSITIVE])
        assert int(batch[K.INPUT_UNITS]) == int(itm[K.INPUT_UNITS])
    src.close()


# ---- the loop's side: one backward, per-task losses logged, exact resume ---------------------

class CountingEngine(DeepSpeedLikeEngine):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.forwards, self.backwards = [], 0

    def __call__(self, batch, task):
        self.forwards.append(task)
        return super().__call__(batch, task)

    def backward(self, loss):
        self.backwards += 1
        super().backward(loss)


def summed_worker(gas: int, source=None, sampler=None):
    from vlp.platform.training.loop import _Worker

    torch.manual_seed(0)
    cfg = loop_config(load_experiment_config(data={
        "data": {"sources": {"a": {"path": "/x"}}}, "tasks": TOY_MIX, "model":
        {"family": "imagebert-tiny"}, "train": {"steps": 10, "grad_accum": gas},
        "optimizer": {"warmup_steps": 2}}))
    assert cfg.train.objective == "summed"
    w = object.__new__(_Worker)
    w.cfg, w.rank, w.world = cfg, 0, 1
    w.task_ids = {t: i for i, t in enumerate(TOY_MIX)}
    w.stage_ends, w.stop_at, w.shape, w.overflow_skips = [10], 10, None, 0
    w.engine = CountingEngine(ToyModel(list(TOY_MIX)), gas)
    w.engine.module.eval()      # no dropout: a restored run draws other dropout masks
    sampler = sampler or objective.build_sampler(None, TOY_MIX, 5, cfg.train.objective)
    source = source or ToyBatchSource(16, 5, rank=0, stage_index=0)
    w.prefetch = Prefetcher(sampler, source, depth=2, device=CPU)
    return w


def test_one_backward_per_summed_micro_batch_and_each_tasks_loss_logged(one_rank):  # noqa: F811
    w = summed_worker(gas=2)
    state, records = TrainerState(), []
    for _ in range(3):
        records.append(w._optimizer_step(state))
    w.prefetch.close()
    assert w.engine.backwards == 6                         # 3 steps × 2 micro-batches
    assert w.engine.forwards == list(TOY_MIX) * 6          # every task on every micro-batch
    weights = loss_weights(TOY_MIX)
    for r in records:
        assert {f"{t}_loss" for t in TOY_MIX} <= set(r)
        assert r["loss"] == pytest.approx(sum(weights[t] * r[f"{t}_loss"] for t in TOY_MIX))
        assert r["tasks"] == [tuple(TOY_MIX)] * 2
    # examples counted once per example set, not once per task
    assert state.examples_seen == sum(r["global_batch_examples"] for r in records)
    assert records[0]["global_batch_examples"] <= 2 * 16


def test_a_restored_summed_loop_continues_with_the_same_batches_and_losses(one_rank):  # noqa: F811
    full = summed_worker(gas=1)
    state, losses = TrainerState(), []
    for step in range(6):
        losses.append(full._optimizer_step(state)["loss"])
        if step == 2:
            saved = full.prefetch.state_dict()       # what a checkpoint at step 3 holds
            weights = {k: v.clone() for k, v in full.engine.module.state_dict().items()}
            opt = full.engine.opt.state_dict()
            sched = full.engine.sched.state_dict()
    full.prefetch.close()
    sampler = SummedTasks(TOY_MIX, 5, known=list(TOY_MIX))
    sampler.load_state_dict(saved["sampler"])
    source = ToyBatchSource(16, 5, rank=0, stage_index=0)
    source.load_state_dict(saved["source"])
    resumed = summed_worker(gas=1, source=source, sampler=sampler)
    resumed.engine.module.load_state_dict(weights)
    resumed.engine.opt.load_state_dict(opt)
    resumed.engine.sched.load_state_dict(sched)
    state = TrainerState(step=3)
    tail = [resumed._optimizer_step(state)["loss"] for _ in range(3)]
    resumed.prefetch.close()
    assert saved["sampler"]["objective"] == "summed" and len(tail) == 3
    assert tail == pytest.approx(losses[3:], rel=1e-6)


# ---- the data stream's side: ranks in step and exact resume, summed ----------------------------

def test_a_restored_summed_stream_serves_the_same_example_sets(tiny_world):
    mix = {"mlm": 2, "itm": 2, "mrfr": 1, "mrc-kl": 1}
    from vlp.models import create_model

    spec = create_model("uniter-tiny", list(mix), region_feat_dim=64, num_classes=17).preprocess
    cfg = DataConfig.for_model(spec, sources(tiny_world), batch_units=1024, read_rows=8,
                               bucket_window=256)
    plan = plan_data(cfg, mix, model=spec)

    def serve(n, state=None):
        src = local_batches(plan)
        if state:
            src.load_state_dict(state)
        sampler = SummedTasks(mix)
        out = []
        for _ in range(n):
            b = src.next(sampler.next())
            out.append([batch_digest(b[K.TASK_BATCHES][t]) for t in mix]
                       + [int(b[K.NUM_EXAMPLES])])
        state = src.state_dict()
        src.close()
        return out, state

    full, _ = serve(30)
    head, state = serve(11)
    tail, _ = serve(19, state)
    assert head + tail == full
    # each task's batch differs (its own masking / negatives) though the examples are shared
    assert all(len(set(row[:-1])) == len(mix) for row in full)


def test_the_ray_data_collate_builds_a_batch_per_task_of_the_same_pairs(tiny_world):
    from vlp.datasets.stream.local_stream import local_blocks
    from vlp.datasets.stream.pipeline import TaskCollateFn
    from vlp.models import create_model

    mix = {"mlm": 1, "itm": 1, "mrfr": 1}
    spec = create_model("imagebert-tiny", list(mix), region_feat_dim=64,
                        num_classes=17).preprocess
    plan = plan_data(DataConfig.for_model(spec, sources(tiny_world), read_rows=8), mix,
                     model=spec)
    table = next(iter(local_blocks(plan)(0)))
    single = TaskCollateFn(plan, "mlm")(table)
    summed = TaskCollateFn(plan, SummedTasks(mix).next())(table)
    per_task = summed[K.TASK_BATCHES]
    assert set(per_task) == set(mix)
    assert int(summed[K.NUM_EXAMPLES]) == int(single[K.NUM_EXAMPLES])   # every pair, once
    for t, b in per_task.items():
        assert int(b[K.NUM_EXAMPLES]) == int(single[K.NUM_EXAMPLES]), t
    assert (per_task["mlm"][K.MLM_LABELS] != -100).any() and K.ITM_LABELS in per_task["itm"]
    assert per_task["mrfr"][K.REGION_MASKED].any()


@pytest.mark.parametrize("name, paper", [("imagebert-base-two-stage.yaml", "summed"),
                                         ("soho-r18-l3.yaml", "summed"),
                                         ("uniter-base-indomain.yaml", "sampled"),
                                         ("vlbert-base.yaml", "summed")])
def test_the_shipped_configs_train_at_their_papers_objective_without_saying_it(name, paper):
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "jobs" / "configs" / name
    cfg = load_experiment_config(path)
    assert cfg.train.objective == "" and objective_of(cfg) == paper


def test_model_flops_count_every_tasks_forward_of_the_set(tiny_world):
    mix = {"mlm": 1, "mvm": 1, "itm": 1}
    _, src = summed_source(tiny_world, "soho-tiny", mix)
    item = Prefetcher(SummedTasks(mix), src, depth=0, device=CPU).next()
    src.close()
    units = {t: int(b[K.INPUT_UNITS]) for t, b in item.batch[K.TASK_BATCHES].items()}
    assert item.input_units == units["itm"]                        # the set, counted once
    assert item.passes == pytest.approx(sum(units.values()) / units["itm"])
    assert 1.5 < item.passes < 2.5      # ITM on the whole set, MLM and MVM on its half


def test_a_checkpoint_with_a_0d_buffer_loads_strictly():
    """SOHO's ResNet has BatchNorm's 0-d ``num_batches_tracked``: finetuning a soho-tiny
    checkpoint (objective_compare.py) failed on it with an IndexError."""
    from torch import nn

    from vlp.models.checkpoints.state_dict_io import LoadReport, assign_strict

    src, dst = nn.BatchNorm1d(3), nn.BatchNorm1d(3)
    src.num_batches_tracked.fill_(7)
    src.running_mean.fill_(0.5)
    tensors = [(k, k, v) for k, v in src.state_dict().items()]
    assign_strict(dst, tensors, lambda k: k, LoadReport("test"))
    assert int(dst.num_batches_tracked) == 7 and torch.equal(dst.running_mean, src.running_mean)

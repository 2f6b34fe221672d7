"""Integration: real pretraining (uniter-tiny, the pipeline, MLflow) on 2 Ray Train CPU workers
with DeepSpeed ZeRO-2 on the tiny world, in two stages (out-of-domain web captions, then
in-domain with another mix) — ImageBERT's multi-stage recipe, each stage initialised from the
previous one.

Three fits (~20 s each on a quiet 2-core machine): a straight 24-step run; the same job
stopped at step 10 (mid-stage, mid-epoch); and that job resumed, with rank 1 raising once at
step 19 — it must finish from the step-16 checkpoint with the very same per-step losses as
the straight run (the data stream re-read and the served batches skipped), the same examples
seen and final step, and exactly one MLflow run across stop, resume and restart. Once ended,
the run is what `vlp pretrain` reports instead of starting workers again. The stopped fit
builds its batches in separate processes (``train.batch_builder: process``) and the resumed
one on threads, from the state the builders checkpointed.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import ray.train

from vlp.platform.pretrain.components import PretrainComponents
from vlp.platform.pretrain.job import finished_run, load_pretrain_config, pretrain
from vlp.platform.tracking.mlflow_run import RUN_KEY_TAG, embedded_tracking_uri, run_key

pytestmark = pytest.mark.integration

STEPS, STOP, FAIL_AT = 24, 10, 19       # 2 stages of 12 steps; checkpoints every 8 + stage ends


def config(world: str, root: Path, name: str, *overrides: str):
    images = Path(world) / "images"
    return load_pretrain_config(data={
        "run": {"name": name, "output_dir": str(root), "seed": 0, "max_failures": 1},
        "model": {"family": "uniter-tiny"},
        "data": {"sources": {n: {"path": str(images / n)} for n in ("coco", "vg", "cc", "sbu")},
                 "batch_input_units": 1024, "bucket_window": 256},
        "tasks": {"mlm": 2, "itm": 2, "mrfr": 1, "mrc-kl": 1},
        "stages": [{"name": "web", "steps": 12, "sources": ["cc", "sbu"]},
                   {"name": "indomain", "steps": 12, "sources": ["coco", "vg"],
                    "tasks": {"mlm": 2, "mrfr": 1, "mrc-kl": 1}}],
        "optimizer": {"lr": 3e-3, "warmup_steps": 2},
        "train": {"zero_stage": 2, "log_every": 4},
        "scaling": {"num_workers": 2, "cpus_per_worker": 1},
        "checkpoint": {"interval": 8, "keep": 2},
        "mlflow": {"metric_window": 1},     # a row per step: the steps' losses compared
    }, overrides=overrides)


class _FailOnce:
    """A batch source that raises at its ``call``-th batch, once per job (marker file)."""

    def __init__(self, source: Any, call: int, marker: str):
        self.source, self.call, self.marker, self.calls = source, call, marker, 0

    def next(self, task: str):
        self.calls += 1
        if self.calls == self.call and not Path(self.marker).exists():
            Path(self.marker).write_text("injected\n")
            raise RuntimeError(f"test: injected worker failure at batch {self.calls}")
        return self.source.next(task)

    def state_dict(self):
        return self.source.state_dict()

    def load_state_dict(self, state):
        self.source.load_state_dict(state)

    def close(self):
        self.source.close()


@dataclass
class FailingComponents(PretrainComponents):
    """The real components; rank 1's batch source of stage 2 fails once."""
    fail_call: int = 0
    marker: str = ""

    def build_batch_source(self, cfg, stage, stage_index, worker):
        source = super().build_batch_source(cfg, stage, stage_index, worker)
        if stage_index == 1 and worker.rank == 1:
            return _FailOnce(source, self.fail_call, self.marker)
        return source


class _Recording:
    """A batch source that appends each task it serves to ``path`` (one line per batch)."""

    def __init__(self, source: Any, path: str):
        self.source, self.path = source, path

    def next(self, task: str):
        with open(self.path, "a") as f:
            f.write(task + "\n")
        return self.source.next(task)

    def state_dict(self):
        return self.source.state_dict()

    def load_state_dict(self, state):
        self.source.load_state_dict(state)

    def close(self):
        self.source.close()


@dataclass
class RecordingComponents(PretrainComponents):
    """The real components; every rank records the tasks its loop drew, per stage."""
    folder: str = ""

    def build_batch_source(self, cfg, stage, stage_index, worker):
        source = super().build_batch_source(cfg, stage, stage_index, worker)
        return _Recording(source, f"{self.folder}/rank{worker.rank}-stage{stage_index}.txt")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    import ray.cloudpickle

    # workers cannot import this test module: ship FailingComponents by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    return tmp_path_factory.mktemp("pretrain-runs")


def run(world, root, name, *overrides, components=None, callbacks=None):
    from vlp.platform.pretrain.run import run_pretraining
    from vlp.platform.pretrain.data import prepare
    from vlp.platform.pretrain.job import resolved

    cfg = config(world, root, name, *overrides)
    if components is None:
        return pretrain(cfg, progress=False, say=lambda line: None)
    cfg = resolved(cfg)
    return run_pretraining(cfg, components(prepare(cfg)), callbacks=callbacks)


class ControllerModules(ray.train.UserCallback):
    """Runs in the Train controller: writes which heavy modules it has imported."""

    def __init__(self, path: str):
        self.path = path

    def after_report(self, run_context, metrics, checkpoint):
        with open(self.path, "w") as f:
            json.dump(sorted(m for m in sys.modules if m.split(".")[0] in
                             ("vlp", "transformers", "torch", "tokenizers", "deepspeed")), f)


@pytest.fixture(scope="module")
def straight(ray_local, tiny_world, root):
    folder = root / "drawn-tasks"
    folder.mkdir()
    return run(tiny_world, root, "straight",
               components=lambda setup: RecordingComponents(setup, folder=str(folder)),
               callbacks=[ControllerModules(str(root / "controller-modules.json"))])


def test_the_controller_does_not_import_the_jobs_components(straight, root):
    """The loop's config reaches the workers sealed (sealed_config.py): the Train controller
    never unpickles the components, so it imports neither the model families nor
    transformers (it did, ~2 s of CPU per run)."""
    modules = json.loads((root / "controller-modules.json").read_text())
    assert "vlp.platform.training.sealed_config" in modules     # the entry point it holds
    assert not [m for m in modules if m.startswith(("transformers", "vlp.models",
                                                    "vlp.platform.pretrain.components",
                                                    "deepspeed"))], modules


def mlflow_runs(root: Path, name: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(embedded_tracking_uri(root))
    exp = client.get_experiment_by_name("vlp-pretrain")
    key = run_key(str(root.resolve()), name)
    return client, client.search_runs([exp.experiment_id],
                                      filter_string=f"tags.`{RUN_KEY_TAG}` = '{key}'")


def task_losses(history, task):
    return [h[f"{task}_loss"] for h in history if f"{task}_loss" in h]


def test_two_workers_two_stages_losses_fall_and_mlflow_holds_the_run(straight, root):
    r = straight
    assert r.completed and r.final_step == STEPS
    assert r.checkpoint_path == str(root / "straight" / "checkpoint_step00000024")
    h = r.history
    assert [x["step"] for x in h] == list(range(1, STEPS + 1))
    assert [x["stage"] for x in h] == [0] * 12 + [1] * 12
    assert "itm" in {t for x in h[:12] for t in x["tasks"]}
    assert {t for x in h[12:] for t in x["tasks"]} <= {"mlm", "mrfr", "mrc-kl"}  # stage 2's mix
    for task in ("mlm", "mrfr"):      # each task's loss falls over the run
        losses = task_losses(h, task)
        assert len(losses) >= 4, (task, losses)
        first, last = sum(losses[:2]) / 2, sum(losses[-2:]) / 2
        assert last < 0.95 * first, (task, losses)
    assert r.return_value["examples_seen"] == sum(x["global_batch_examples"] for x in h)
    assert all(x["global_batch_input_units"] <= 2 * 1024 for x in h)
    # each rank's loop drew its own tasks: the same list on both ranks, the one in the history
    for stage in (0, 1):
        drawn = [(root / "drawn-tasks" / f"rank{k}-stage{stage}.txt").read_text().split()
                 for k in (0, 1)]
        assert drawn[0] == drawn[1] == [t for x in h if x["stage"] == stage for t in x["tasks"]]
        assert len(set(drawn[0])) >= 3

    ckpt = Path(r.checkpoint_path)
    meta = json.loads((ckpt / "vlp_trainer.json").read_text())
    assert (meta["step"], meta["stage"]) == (STEPS, 1)
    assert {"vlp_rank_000.pt", "vlp_rank_001.pt", "latest"} <= {p.name for p in ckpt.iterdir()}

    client, runs = mlflow_runs(root, "straight")
    assert len(runs) == 1 and runs[0].info.run_id == r.mlflow_run_id
    run_ = runs[0]
    assert run_.info.status == "FINISHED"
    p = run_.data.params
    assert p["model.family"] == "uniter-tiny" and p["optimizer.lr"] == "0.003"
    assert p["stages.0.name"] == "web" and p["stages.1.tasks.mrfr"] == "1.0"
    assert p["data.batch_input_units"] == "1024" and p["train.zero_stage"] == "2"
    assert int(p["derived.parameters"]) == r.return_value["parameters"] > 0
    logged = {m.step: m.value for m in client.get_metric_history(run_.info.run_id, "loss")}
    assert logged == pytest.approx({x["step"]: x["loss"] for x in h})
    for key in ("mlm_loss", "itm_loss", "mrfr_loss", "mrc-kl_loss", "examples_per_s",
                "input_units_per_s", "lr"):
        assert client.get_metric_history(run_.info.run_id, key), key
    artifacts = {a.path for d in ("config", "plots", "checkpoint")
                 for a in client.list_artifacts(run_.info.run_id, d)}
    assert {"config/experiment.yaml", "plots/loss_curve.png", "checkpoint/latest.json"} \
        <= artifacts
    pointer = json.loads(Path(client.download_artifacts(
        run_.info.run_id, "checkpoint/latest.json", str(root / "dl"))).read_text())
    assert pointer["checkpoint"] == r.checkpoint_path and pointer["completed"]


def test_stop_resume_and_worker_failure_continue_exactly(straight, tiny_world, root):
    # 1) the same job, stopped at step 10: mid-stage 1, between checkpoint intervals; its
    #    batches built in a process of their own (train.batch_builder: process), which reads
    #    the worker's Ray Data shard through the worker and makes the epoch sync there
    stopped = run(tiny_world, root, "resumed", f"train.stop_after={STOP}",
                  "train.batch_builder=process")
    assert stopped.final_step == STOP and not stopped.completed
    assert stopped.checkpoint_path.endswith(f"checkpoint_step{STOP:08d}")
    assert finished_run(config(tiny_world, root, "resumed")) is None   # not ended: resume it

    # 2) re-run: resumes at step 10; rank 1 fails once at step 19 (stage 2's 7th batch) →
    #    Ray restarts the workers from the step-16 checkpoint
    marker = root / "fault-injected"
    resumed = run(tiny_world, root, "resumed", components=lambda setup: FailingComponents(
        setup, fail_call=FAIL_AT - 12, marker=str(marker)))
    assert marker.exists()                                    # the failure did happen
    assert resumed.completed and resumed.final_step == STEPS
    assert resumed.return_value["start_step"] == 16           # last attempt began at step 16
    assert resumed.checkpoint_path.endswith(f"checkpoint_step{STEPS:08d}")
    assert resumed.return_value["examples_seen"] == straight.return_value["examples_seen"]

    # every step's loss, logged by the three attempts (steps after 16 may be logged twice), is
    # the straight run's: steps 1-10 built by the builder process, the rest on threads from
    # the state it checkpointed
    want = {x["step"]: x["loss"] for x in straight.history}
    client, runs = mlflow_runs(root, "resumed")
    assert len(runs) == 1                                     # one MLflow run for the job
    run_ = runs[0]
    assert run_.info.run_id == stopped.mlflow_run_id == resumed.mlflow_run_id
    assert run_.info.status == "FINISHED"
    history = client.get_metric_history(run_.info.run_id, "loss")
    assert {m.step for m in history} == set(range(1, STEPS + 1))
    for m in history:
        assert m.value == pytest.approx(want[m.step], rel=1e-6, abs=1e-7), m.step
    # the step log in the run's storage: each step once (the parts the failed attempt wrote
    # after its checkpoint cut back when the workers restarted), the straight run's losses
    from vlp.platform.cluster.run_storage import open_location
    from vlp.platform.tracking.step_log import read_steps

    steps = read_steps(open_location(str(root)), "resumed")
    assert list(steps["step"]) == list(range(1, STEPS + 1))
    for step, loss in zip(steps["step"], steps["loss"]):
        assert loss == pytest.approx(want[step], rel=1e-6, abs=1e-7), step

    # 3) re-run once more: it has ended, so `vlp pretrain` says so instead of starting workers
    assert finished_run(config(tiny_world, root, "resumed")) == (
        f"run resumed already finished: step {STEPS} of {STEPS}, checkpoint "
        f"{resumed.checkpoint_path}, MLflow run {run_.info.run_id}; nothing to train (a new "
        f"run.name starts a new run)")


def test_the_trained_weights_beat_the_initial_ones_on_the_same_batches(straight, tiny_world,
                                                                       root):
    """What an optimizer that does nothing would leave is the run's own initial weights
    (``seed_everything(run.seed)`` then the model, as every worker builds it): the trained
    weights must score clearly lower MLM and MRFR losses on the same in-domain batches."""
    import torch

    from vlp.datasets.stream.local_stream import local_blocks
    from vlp.datasets.batching.pretrain_batches import PretrainBatches
    from vlp.platform.training import checkpointing
    from vlp.platform.pretrain.data import prepare
    from vlp.platform.pretrain.job import resolved

    cfg = resolved(config(tiny_world, root, "straight"))
    setup = prepare(cfg)
    components = PretrainComponents(setup)
    tasks = list(cfg.all_tasks())
    checkpointing.seed_everything(cfg.run.seed)
    initial = components.build_model(cfg, tasks)
    trained = components.build_model(cfg, tasks)
    files = Path(straight.checkpoint_path) / f"step{STEPS:08d}"
    trained.load_state_dict(torch.load(files / "mp_rank_00_model_states.pt",
                                       weights_only=False)["module"])
    plan = setup.stages[1].plan
    for task in ("mlm", "mrfr"):
        batches = PretrainBatches(plan, local_blocks(plan, 0, 1), rank=0)
        held = [batches.next(task) for _ in range(4)]
        batches.close()
        losses = []
        for model in (initial, trained):
            model.eval()
            with torch.no_grad():
                losses.append(sum(float(model(b, task=task)["loss"]) for b in held) / 4)
        assert losses[1] < 0.8 * losses[0], (task, losses)

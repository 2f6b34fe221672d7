"""Integration on Ray Train: a real pretraining job (uniter-tiny on the tiny world, Ray Data's
stream, ``data.stream: global``) stopped on 2 workers resumes on 1 through ``vlp``'s job
path: the driver lets it through (the global stream can move), Ray Train hands each worker
the whole dataset (not split), and the one worker trains global micro-batches 4-7 after the
two trained 0-3 (rank r the indices r, r + 2): nothing skipped or trained twice across Ray's
checkpoint. The same checkpoint with ``data.stream: per_worker`` is refused on the driver,
in one line, before any worker starts. (That the global index fixes the examples and the
losses: ``test_pretrain_resume_world.py``.)"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from vlp.platform.pretrain.components import PretrainComponents
from vlp.platform.pretrain.job import load_pretrain_config

pytestmark = pytest.mark.integration


def config(world: str, root: Path, *overrides: str):
    images = Path(world) / "images"
    return load_pretrain_config(data={
        "run": {"name": "moves", "output_dir": str(root), "seed": 0},
        "model": {"family": "uniter-tiny"},
        "data": {"sources": {n: {"path": str(images / n)} for n in ("coco", "vg", "cc", "sbu")},
                 "batch_input_units": 1024, "bucket_window": 256, "stream": "global"},
        "tasks": {"mlm": 2, "itm": 2, "mrfr": 1, "mrc-kl": 1},
        "optimizer": {"lr": 3e-3, "warmup_steps": 2},
        "train": {"steps": 4, "log_every": 1},
        "scaling": {"num_workers": 2, "cpus_per_worker": 1},
        "mlflow": {"enabled": False},
    }, overrides=overrides)


class _Indexed:
    """A batch source that appends the global index of each batch it serves to ``path``."""

    def __init__(self, source: Any, path: str):
        self.source, self.path = source, path
        self.global_order = source.global_order

    def next(self, task: str):
        batch = self.source.next(task)
        with open(self.path, "a") as f:
            f.write(f"{self.source._next_own - self.source.take_world}\n")
        return batch

    def __getattr__(self, name):     # state_dict, load_resharded_state, reshardable, close
        return getattr(self.source, name)


@dataclass
class IndexedComponents(PretrainComponents):
    folder: str = ""

    def build_batch_source(self, cfg, stage, stage_index, worker):
        source = super().build_batch_source(cfg, stage, stage_index, worker)
        return _Indexed(source, f"{self.folder}/w{worker.world_size}-rank{worker.rank}.txt")


@pytest.mark.timeout(600)
def test_a_global_stream_job_stopped_on_two_workers_resumes_on_one(ray_local, tiny_world,
                                                                    tmp_path):
    import ray.cloudpickle

    from vlp.platform.pretrain.data import prepare
    from vlp.platform.pretrain.job import pretrain, resolved
    from vlp.platform.pretrain.run import run_pretraining

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

    def run(*overrides):
        cfg = resolved(config(tiny_world, tmp_path, *overrides))
        return run_pretraining(cfg, IndexedComponents(prepare(cfg), folder=str(tmp_path)))

    first = run("train.stop_after=2")
    assert (first.final_step, first.completed) == (2, False)
    with pytest.raises(ValueError) as e:      # per-worker: refused before any worker starts
        pretrain(config(tiny_world, tmp_path, "scaling.num_workers=1",
                        "data.stream=per_worker"), progress=False, say=lambda line: None)
    assert "\n" not in str(e.value) and "data.stream: per_worker" in str(e.value)
    assert "resume on 2 workers" in str(e.value)
    second = run("scaling.num_workers=1")
    assert (second.final_step, second.completed) == (4, True)
    assert second.return_value["start_step"] == 2

    def indices(name):
        return [int(x) for x in (tmp_path / name).read_text().split()]

    assert indices("w2-rank0.txt") == [0, 2] and indices("w2-rank1.txt") == [1, 3]
    assert indices("w1-rank0.txt") == [4, 5, 6, 7]          # grad_accum 2: two a step

"""A shipped GPU config submitted as it is (sizes only overridden), with no run storage
set: attached to a Ray cluster whose only live node cannot hold the job's workers (an
autoscaling cluster at submit time: the head, no GPU), the node-local default is refused in
one line naming VLP_STORAGE, before any Ray Train worker starts."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_shipped_gpu_config_without_storage_is_refused_before_any_worker(
        ray_local, tiny_world, tmp_path, monkeypatch, capsys):
    from vlp.cli import main

    for k in ("VLP_STORAGE", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.chdir(tmp_path)
    sizes = ["model.family=uniter-tiny", "model.init=random", "model.init_path=",
             "data.tokenizer_path=", f"data.sources.coco.path={tiny_world}/images/coco",
             f"data.sources.vg.path={tiny_world}/images/vg", "data.batch_input_units=1024",
             "data.bucket_window=512", "train.steps=2", "optimizer.warmup_steps=1"]
    args = ["pretrain", "--config", str(ROOT / "jobs/configs/uniter-base-indomain.yaml")]
    for s in sizes:
        args += ["--set", s]
    assert ray_local.is_initialized()
    assert main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("pretrain failed: StorageError: run storage 'runs' is a relative "
                          "path"), err
    assert "cannot hold the 8 worker(s)' CPU, GPU, accelerator_type:A10G" in err, err
    assert "VLP_STORAGE=s3://" in err
    # no Ray Train run started: it would have made the run's folder
    assert not (tmp_path / "runs" / "uniter-base-indomain").exists()

"""Where finetune runs go in MLflow: nested under the pretraining run that wrote the
checkpoint (found by its run key in that run's store), under a given parent (a sweep
trial), or under a parent run of their own that holds Meta-Sum.

    pretraining run (or sweep trial)
      ├── finetune <name>-vqa        metrics, predictions/vqa-val.json
      ├── finetune <name>-retrieval  ...
      └── ...                        parent gets downstream.<part> and downstream.meta_sum
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any
from pathlib import Path

from vlp.platform.cluster.run_storage import is_uri, open_location
from vlp.platform.tracking.mlflow_run import (MlflowRun, embedded_tracking_uri, run_id_by_key,
                                           run_key)

TRAINER_META = "vlp_trainer.json"


@dataclass
class Parent:
    tracking_uri: str
    run_id: str
    experiment: str
    owned: bool          # we created it (no pretraining run to nest under)


def pretraining_run_of(checkpoint: str, tracking_uri: str = "") -> tuple[str, str] | None:
    """(tracking URI, run id) of the pretraining run that wrote ``checkpoint``, when it is a
    platform checkpoint (``<storage>/<run>/checkpoint_*``, a folder or a URI) whose run can be
    found: its key is the storage root + run name (``pretrain.tracking_spec``)."""
    where = checkpoint_folder_uri(checkpoint) if is_uri(checkpoint) else _local_folder(checkpoint)
    if where is None:
        return None
    run_dir = posixpath.dirname(where.rstrip("/"))
    root = posixpath.dirname(run_dir)
    uri = tracking_uri
    if not uri:
        if is_uri(root) or not (Path(root) / "mlflow.db").is_file():
            return None
        uri = embedded_tracking_uri(root)
    key = run_key(root, posixpath.basename(run_dir))
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    ids = [e.experiment_id for e in client.search_experiments()]
    if not ids:
        return None
    run_id = run_id_by_key(client, ids, key)
    return (uri, run_id) if run_id else None


def _local_folder(checkpoint: str) -> str | None:
    p = Path(checkpoint)
    if p.is_file():
        p = p.parent.parent if p.parent.name.startswith("step") else p.parent
    if not (p / TRAINER_META).is_file():
        found = sorted(p.glob(f"checkpoint_*/{TRAINER_META}"))
        if not found:
            return None
        p = found[-1].parent
    return str(p)


def checkpoint_folder_uri(uri: str) -> str | None:
    """The vlp checkpoint folder a URI names: itself, or a run folder's newest."""
    storage = open_location(uri)
    if storage.exists(TRAINER_META):
        return storage.root
    meta = storage.latest_checkpoint_meta()
    return meta["uri"] if meta else None


def resolve_parent(*, tracking_uri: str, experiment: str, run_name: str, output_dir: str,
                   parent_run_id: str = "", checkpoint: str = "") -> Parent:
    """The run to nest finetunes under (see module doc)."""
    from mlflow.tracking import MlflowClient

    if parent_run_id:
        uri = tracking_uri or embedded_tracking_uri(output_dir)
        run = MlflowClient(uri).get_run(parent_run_id)
        exp = MlflowClient(uri).get_experiment(run.info.experiment_id).name
        return Parent(uri, parent_run_id, exp, owned=False)
    if checkpoint:
        found = pretraining_run_of(checkpoint, tracking_uri)
        if found:
            uri, rid = found
            client = MlflowClient(uri)
            exp = client.get_experiment(client.get_run(rid).info.experiment_id).name
            return Parent(uri, rid, exp, owned=False)
    uri = tracking_uri or embedded_tracking_uri(output_dir)
    run = MlflowRun.open(uri, experiment, run_name=run_name,
                         key=run_key(output_dir, run_name, "finetune"),
                         tags={"vlp.job": "finetune"})
    return Parent(uri, run.run_id, experiment, owned=True)


def log_benchmark(uri: str, run_id: str, params: dict[str, str], metrics: dict[str, float],
                  predictions: str | None) -> None:
    """A finished finetune's settings, scores and predictions file, into its own run."""
    from mlflow.tracking import MlflowClient

    run = MlflowRun(MlflowClient(uri), run_id, "", uri)
    run.log_params(params)
    run.log_metrics(metrics, step=0)
    run.set_tags({"vlp.job": "finetune"})
    if predictions:
        log_predictions(run, predictions)


def log_predictions(run: Any, predictions: str) -> None:
    """The predictions file (a local path, or a URI in the run's storage: fetched into a
    temporary folder first, MLflow uploads local files) as the run's artifact."""
    from vlp.platform.cluster.run_storage import local_copy

    if not is_uri(predictions):
        run.log_artifact(predictions, "predictions")
        return
    import tempfile

    folder, name = predictions.rstrip("/").rsplit("/", 1)
    with tempfile.TemporaryDirectory(prefix="vlp-predictions-") as tmp:
        run.log_artifact(str(local_copy(folder, [name], cache=tmp) / name), "predictions")


def log_summary(parent: Parent, scores: dict[str, float], meta_sum: float | None,
                protocols: dict[str, str] | None = None) -> None:
    """Meta-Sum's parts on the parent run, and the protocol each benchmark was finetuned
    with (tags ``downstream_protocol.<benchmark>``: a sweep trial's finetunes log one
    benchmark each)."""
    from mlflow.tracking import MlflowClient

    run = MlflowRun(MlflowClient(parent.tracking_uri), parent.run_id, "", parent.tracking_uri)
    if protocols:
        run.set_tags({f"downstream_protocol.{k.replace('+', 'plus')}": v
                      for k, v in protocols.items()})
    metrics = {f"downstream.{k.replace('+', 'plus')}": v for k, v in scores.items()}
    if meta_sum is not None:
        metrics["downstream.meta_sum"] = meta_sum
    if metrics:
        run.log_metrics(metrics, step=0)
    if parent.owned:
        run.finish("FINISHED")

"""Where pretrained weights are: a checkpoint path or URI resolved to the one model-states file
it designates, fetched into a local cache from a URI. Apart from ``pretrained_weights`` (which
re-exports these names) because what only needs a file imports no model: the extraction
actors, each sweep trial and the pretraining preflight import this, and the model stack
(transformers' BERT, dynamo) would cost each of them ~1.8 CPU s.
"""

from __future__ import annotations

import json
from pathlib import Path

from vlp.models.checkpoints.state_dict_io import CheckpointError
from vlp.platform.cluster.run_storage import StorageError, is_uri, local_copy, open_location

TRAINER_META = "vlp_trainer.json"       # vlp/platform/training/checkpointing.py
MODEL_STATES = "mp_rank_00_model_states.pt"
MODEL_FILES = ("model.safetensors", "pytorch_model.bin", "model.pt")   # a model folder's weights


def resolve(path: str | Path) -> Path:
    """The model-states file a checkpoint path (or URI, e.g. ``s3://bucket/vlp/run``)
    designates; from a URI only the files read are fetched into a local cache."""
    if is_uri(str(path)):
        return resolve(fetch(str(path)))
    p = Path(path).expanduser()
    if p.is_file():
        return p
    if not p.is_dir():
        raise CheckpointError(f"{p}: no such checkpoint file or folder")
    if (p / TRAINER_META).is_file():
        tag = json.loads((p / TRAINER_META).read_text())["tag"]
        f = p / tag / MODEL_STATES
        if not f.is_file():
            raise CheckpointError(f"{p}: a vlp checkpoint without {tag}/{MODEL_STATES} "
                                  "(interrupted while saving?)")
        return f
    found = sorted(c for c in p.glob("checkpoint_*") if (c / TRAINER_META).is_file())
    if found:
        return resolve(found[-1])
    for name in MODEL_FILES:
        if (p / name).is_file():
            return p / name
    raise CheckpointError(f"{p}: neither a vlp checkpoint (no {TRAINER_META}), a pretraining "
                          "run folder (no checkpoint_* inside) nor a model folder")


def fetch(uri: str) -> Path:
    """A local copy of what ``uri`` designates: a state-dict file, a model folder (its
    ``model.safetensors`` / ``pytorch_model.bin``), a vlp checkpoint folder (its trainer meta
    and model states) or a run folder (its newest checkpoint). The one reader of weights by
    URI: finetune and curation checkpoints, ``model.init_path``."""
    import pyarrow.fs as pafs

    try:
        storage = open_location(uri)
        kind = storage.fs.get_file_info(storage.fs_path()).type
        if kind == pafs.FileType.File:
            parent, name = uri.rstrip("/").rsplit("/", 1)
            return local_copy(parent, [name]) / name
        if kind == pafs.FileType.Directory:
            if storage.exists(TRAINER_META):
                tag = json.loads(storage.read_text(TRAINER_META))["tag"]
                return local_copy(uri, [TRAINER_META, f"{tag}/{MODEL_STATES}"])
            meta = storage.latest_checkpoint_meta()
            if meta is not None:
                return local_copy(meta["uri"], [TRAINER_META, f"{meta['tag']}/{MODEL_STATES}"])
            for name in MODEL_FILES:
                if storage.exists(name):
                    return local_copy(uri, [name]) / name
    except (OSError, StorageError) as e:
        raise CheckpointError(f"{uri}: cannot read it ({e})") from None
    raise CheckpointError(f"{uri}: no such checkpoint, run folder, model folder or file")


def local_weights(path: str) -> str:
    """``path`` itself, or for a URI the local copy of the weights file it designates
    (``fetch``): what ``create_model(init="bert:<path>")`` and the like can open."""
    return str(resolve(path)) if path and is_uri(path) else path


__all__ = ["TRAINER_META", "MODEL_STATES", "MODEL_FILES", "resolve", "fetch", "local_weights"]

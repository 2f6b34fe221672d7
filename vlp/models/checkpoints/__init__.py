"""Weights apart from architecture: random init, text-only BERT/MiniLM init, the UNITER
release layout (import and export), all through one strict key/shape check.

The names below are loaded on first use (PEP 562): ``state_dict_io`` (``CheckpointError``,
reading a state dict) then imports without the initializers, which build models and import
transformers' BERT (~1.8 CPU s), so what only reads or locates weights (the extraction
actors, ``training/weights_location.py``) stays light.
"""

from __future__ import annotations

from vlp.models.lazy_names import lazy_names

_FROM = {
    "INITIALIZERS": "vlp.models.checkpoints.initializers",
    "initialize": "vlp.models.checkpoints.initializers",
    "init_bert_weights": "vlp.models.checkpoints.random_init",
    "CheckpointError": "vlp.models.checkpoints.state_dict_io",
    "LoadReport": "vlp.models.checkpoints.state_dict_io",
    "read_state_dict": "vlp.models.checkpoints.state_dict_io",
    "load_bert_path": "vlp.models.checkpoints.text_bert",
    "load_minilm": "vlp.models.checkpoints.text_bert",
    "load_text_bert": "vlp.models.checkpoints.text_bert",
    "minilm_dir": "vlp.models.checkpoints.text_bert",
    "UNITER_VOCAB_SIZE": "vlp.models.checkpoints.uniter_release",
    "export_uniter": "vlp.models.checkpoints.uniter_release",
    "load_uniter": "vlp.models.checkpoints.uniter_release",
    "load_uniter_path": "vlp.models.checkpoints.uniter_release",
    "save_uniter": "vlp.models.checkpoints.uniter_release",
}


__getattr__, __dir__ = lazy_names(__name__, _FROM, globals())

__all__ = list(_FROM)

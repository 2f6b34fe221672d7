"""Weights apart from architecture: random init, text-only BERT/MiniLM init, the UNITER
release layout (import and export), all through one strict key/shape check."""

from vlp.models.checkpoints.initializers import INITIALIZERS, initialize
from vlp.models.checkpoints.random_init import init_bert_weights
from vlp.models.checkpoints.state_dict_io import CheckpointError, LoadReport, read_state_dict
from vlp.models.checkpoints.text_bert import load_bert_path, load_minilm, load_text_bert, minilm_dir
from vlp.models.checkpoints.uniter_release import (UNITER_VOCAB_SIZE, export_uniter, load_uniter,
                                                   load_uniter_path, save_uniter)

__all__ = ["INITIALIZERS", "initialize", "init_bert_weights", "CheckpointError", "LoadReport",
           "read_state_dict", "load_bert_path", "load_minilm", "load_text_bert", "minilm_dir",
           "UNITER_VOCAB_SIZE", "export_uniter", "load_uniter", "load_uniter_path",
           "save_uniter"]

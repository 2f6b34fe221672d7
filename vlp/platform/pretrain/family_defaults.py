"""Each family's paper's pretraining optimizer, the default wherever a run does not set it
(a family run or a sweep without its recipe): ``ExperimentConfig`` fills every optimizer key
the config leaves out from here before it validates. The static defaults of
``OptimizerSection`` are UNITER's (the reference code's in-domain recipe); the recipes in
jobs/configs/ set every key themselves and are unchanged by this.

- VL-BERT §4.1: Adam, lr 1e-4, betas (0.9, 0.999), weight decay 1e-4, 8,000 warm-up steps,
  linear decay.
- ImageBERT §5.1: Adam, lr 1e-4 (betas not stated: Adam's own (0.9, 0.999)); warm-up and
  weight decay are not stated: the recipe's 5,000 and 0.01, vlp's.
- SOHO §4.1: AdamW lr 1e-4, weight decay 1e-2 for the Transformer (the CNN's SGD is
  ``optimizer.cnn*``'s default already); no warm-up stated: none. Its ×0.1 steps at epochs 25
  and 35 of 40 need the run's length, so the default schedule is linear decay and the recipe
  sets ``schedule: step`` with its milestones.

A family's kind is its name's first part (``data_config.family_kind``), so that loading a
config does not import the model zoo.
"""

from __future__ import annotations

from typing import Any

from vlp.datasets.stream.data_config import family_kind

FAMILY_OPTIMIZER: dict[str, dict[str, Any]] = {
    "uniter": {},      # OptimizerSection's own defaults
    "vlbert": {"lr": 1e-4, "betas": [0.9, 0.999], "weight_decay": 1e-4, "warmup_steps": 8000,
               "schedule": "linear"},
    "imagebert": {"lr": 1e-4, "betas": [0.9, 0.999], "weight_decay": 0.01,
                  "warmup_steps": 5000},
    "soho": {"lr": 1e-4, "betas": [0.9, 0.999], "weight_decay": 0.01, "warmup_steps": 0},
}
DEFAULT_FAMILY = "uniter-tiny"     # ModelSection.family's default


def with_family_defaults(raw: Any) -> Any:
    """``raw`` (a config mapping before validation) with the optimizer keys it leaves out
    taken from its family's paper; anything else (not a mapping) as it is."""
    if not isinstance(raw, dict):
        return raw
    model = raw.get("model")
    family = model.get("family", DEFAULT_FAMILY) if isinstance(model, dict) else DEFAULT_FAMILY
    defaults = FAMILY_OPTIMIZER.get(family_kind(str(family)), {})
    optimizer = raw.get("optimizer", {})
    if not defaults or not isinstance(optimizer, dict):
        return raw
    return {**raw, "optimizer": {**defaults, **optimizer}}

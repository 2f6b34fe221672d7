"""The files and folders a pretraining config reads (weights, vocabulary, shard folders) and
which of them this machine cannot reach: ``vlp pretrain --check`` of a cluster config on a
laptop judges the config itself and lists these, rather than stopping at the first one."""

from __future__ import annotations

from vlp.platform.pretrain.experiment_config import ExperimentConfig

# what each input is, for the line that names it
WHAT = {"model.init_path": "initial weights", "model.cnn_init": "CNN weights",
        "data.tokenizer_path": "WordPiece vocabulary"}


def config_inputs(cfg: ExperimentConfig) -> list[tuple[str, str]]:
    """(dotted key, path or URI) of every input the config names, in config order."""
    out = [(k, v) for k, v in (("model.init_path", cfg.model.init_path),
                               ("model.cnn_init", cfg.model.cnn_init),
                               ("data.tokenizer_path", cfg.data.tokenizer_path)) if v]
    used = {name for st in cfg.stage_plan() for name in st.sources}
    out += [(f"data.sources.{name}.path", src.path)
            for name, src in cfg.data.sources.items() if name in used]
    return out


def unreachable_inputs(cfg: ExperimentConfig) -> list[tuple[str, str]]:
    """The inputs of ``config_inputs`` that do not exist from here (a local path absent, or
    a URI its storage does not answer for)."""
    from vlp.platform.cluster.run_storage import location_exists

    return [(key, path) for key, path in config_inputs(cfg) if not location_exists(path)]


def unreachable_report(config_path: str, missing: list[tuple[str, str]]) -> list[str]:
    """The screen ``--check`` prints for a valid config whose inputs are elsewhere."""
    lines = [f"config {config_path} is valid (keys, values, family, task mix, stages, text "
             f"length); {len(missing)} input(s) are not reachable from here, so the checks "
             f"that read them (shards, feature widths, vocabulary, weights' fit) did not run:"]
    width = max(len(k) for k, _ in missing)
    for key, path in missing:
        what = WHAT.get(key, "shard folder")
        lines.append(f"  {key:<{width}}  {path}  ({what})")
    sets = " ".join(f"--set {k}={'FILE' if k in WHAT else 'DIR'}" for k, _ in missing[:2])
    lines.append(f"to check them, run --check where they are (the cluster's head) or point "
                 f"the keys at local copies: {sets}{' ...' if len(missing) > 2 else ''}")
    return lines

"""The shipped GPU configs against the cluster cluster.yaml builds: /mnt/shared is a
read-only Mountpoint-S3 mount, so no config writes there; the Table 3 sweep passes its
`--check` with a read-only folder standing in for /mnt/shared, and the folders its run
creates first are writable."""

from __future__ import annotations

import re
import shutil
import stat
from pathlib import Path

import pytest
import yaml
from cluster_helpers import shipped_gpu_configs

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "jobs" / "configs"


def read_only_mount() -> str:
    setup = " ".join(yaml.safe_load((ROOT / "cluster.yaml").read_text())["setup_commands"])
    return re.search(r"mount-s3 --read-only .*? (/\S+)\)?$", setup, re.M).group(1).rstrip(")")


def gpu_configs() -> list[Path]:
    return shipped_gpu_configs(CONFIGS)


def written_paths(raw: dict) -> dict[str, str]:
    """The keys of a config that name where a run writes."""
    out = {}
    for section in ("run", "sweep"):
        for key in ("output_dir", "storage"):
            value = (raw.get(section) or {}).get(key)
            if value:
                out[f"{section}.{key}"] = value
    uri = (raw.get("mlflow") or {}).get("tracking_uri") or ""
    if uri:
        out["mlflow.tracking_uri"] = uri
    return out


def test_no_shipped_gpu_config_writes_under_the_read_only_mount():
    mount = read_only_mount()
    assert mount == "/mnt/shared"
    configs = gpu_configs()
    assert len(configs) >= 7
    for path in configs:
        for key, value in written_paths(yaml.safe_load(path.read_text())).items():
            assert mount not in value, f"{path.name}: {key}={value} is on the read-only mount"


def make_read_only(folder: Path) -> None:
    for p in [folder, *folder.rglob("*")]:
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def test_the_table3_sweep_checks_and_starts_against_a_read_only_shared_folder(
        tiny_world, tmp_path, monkeypatch):
    """/mnt/shared replaced by a read-only folder holding the world and a BERT folder (tiny:
    the only overrides are sizes, uniter-tiny and a 64-wide BERT); `vlp sweep --check`
    passes, and the folders the run makes first (its scratch folder, its storage) are made
    without touching the read-only folder."""
    from transformers import BertConfig, BertForPreTraining

    from vlp.commands.sweep import overrides as sweep_overrides  # noqa: F401 (CLI present)
    from vlp.cli import main
    from vlp.platform.sweep import load_sweep_config

    shared = tmp_path / "shared"
    shutil.copytree(tiny_world, shared / "worlds" / "full")
    BertForPreTraining(BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=256)
                       ).save_pretrained(shared / "models" / "bert-base-uncased")
    make_read_only(shared)
    text = (CONFIGS / "table3-uniter-base.yaml").read_text().replace("/mnt/shared", str(shared))
    config = tmp_path / "table3.yaml"
    config.write_text(text)
    work = tmp_path / "job"            # the job's working folder (what --working-dir unpacks)
    work.mkdir()
    monkeypatch.chdir(work)
    for k in ("VLP_STORAGE", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(k, raising=False)
    sizes = ["model.family=uniter-tiny"]
    args = ["sweep", "--config", str(config), "--check"]
    for s in sizes:
        args += ["--set", s]
    try:
        assert main(args) == 0
        cfg = load_sweep_config(config, sizes).resolved()
        Path(cfg.sweep_dir).mkdir(parents=True, exist_ok=True)     # Ray's log goes here
        cfg.sweep_storage().create_root()                          # Tune's state, the trials
    finally:
        for p in [shared, *shared.rglob("*")]:
            p.chmod(p.stat().st_mode | stat.S_IWUSR)
    # (as root, chmod does not stop a write: the locations are checked by name too)
    assert not str(Path(cfg.sweep_dir).resolve()).startswith(str(shared))
    assert not cfg.sweep_storage().root.startswith(str(shared))


@pytest.mark.parametrize("path", gpu_configs(), ids=lambda p: p.name)
def test_shipped_gpu_configs_choose_precision_by_device(path):
    """precision: auto (bf16 where the GPU has it, fp16 with loss scaling where not); the
    sweep's finetunes too."""
    raw = yaml.safe_load(path.read_text())
    train = raw.get("train") or (raw.get("pretrain") or {}).get("train") or {}
    assert train.get("precision", "auto") == "auto", path.name
    for o in (raw.get("finetune") or {}).get("overrides", []) if isinstance(
            raw.get("finetune"), dict) else []:
        assert not o.startswith("train.precision=") or o.split("=", 1)[1].split()[0] == "auto"

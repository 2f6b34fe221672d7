"""How long vlp takes to load and validate a config file (YAML read, overrides, types, limits,
cross-field rules), as a job does before anything starts.

    python jobs/benchmarks/config_load.py                                  # uniter-base
    python jobs/benchmarks/config_load.py --config jobs/configs/sweep-demo.yaml
    python jobs/benchmarks/config_load.py --baseline /tmp/vlp-main         # and another tree

The loader follows the file's name as the tests do (``finetune*``: the finetune config;
``sweep*``/``table3*``: the sweep config; else the pretraining experiment config, without the
model registry's checks). ``--baseline DIR`` measures the same in a fresh process importing vlp
from DIR (e.g. a checkout of the commit before a loader change), so both figures come from
one run on one machine.

Prints one figure per line: ``<tree>.import_s`` (importing the config module), ``<tree>.
first_load_ms``, ``<tree>.load_ms`` (median of ``--repeat`` loads after the first) and
``<tree>.validate_ms`` (the same from the parsed YAML: the loader's own share).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def loader(path: Path):
    """The load function a job uses for ``path``, and its extra overrides."""
    if path.name.startswith("finetune"):   # takes its checkpoint from --checkpoint
        from vlp.platform.finetune.finetune_config import load_finetune_config
        return load_finetune_config, ["model.checkpoint=runs/pretrain"]
    if path.name.startswith(("sweep", "table3")):
        from vlp.platform.sweep.sweep_config import load_sweep_config
        return load_sweep_config, []
    from vlp.platform.pretrain.experiment_config import load_experiment_config
    return load_experiment_config, []


def measure(path: Path, repeat: int, tree: str) -> None:
    start = time.perf_counter()
    load, overrides = loader(path)
    print(f"{tree}.import_s {time.perf_counter() - start:.3f}")
    start = time.perf_counter()
    load(path, overrides)
    print(f"{tree}.first_load_ms {1e3 * (time.perf_counter() - start):.3f}")
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        load(path, overrides)
        times.append(time.perf_counter() - start)
    print(f"{tree}.load_ms {1e3 * statistics.median(times):.3f}")
    raw = yaml.safe_load(path.read_text())
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        load(None, overrides, data=raw)
        times.append(time.perf_counter() - start)
    print(f"{tree}.validate_ms {1e3 * statistics.median(times):.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "jobs/configs/table3-uniter-base.yaml"))
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--baseline", default="", help="another vlp tree to measure alike")
    ap.add_argument("--tree", default="this", help=argparse.SUPPRESS)
    args = ap.parse_args()
    path = Path(args.config).resolve()
    if args.tree == "this":
        print(f"# config_load: {path.name}, median of {args.repeat} loads, python "
              f"{sys.version.split()[0]}")
    if args.baseline:
        env = dict(os.environ, PYTHONPATH=str(Path(args.baseline).resolve()))
        subprocess.run([sys.executable, __file__, "--config", str(path), "--repeat",
                        str(args.repeat), "--tree", "baseline"], env=env, check=True,
                       cwd=args.baseline)
    measure(path, args.repeat, args.tree)


if __name__ == "__main__":
    main()

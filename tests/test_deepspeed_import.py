"""``load_deepspeed`` (deepspeed_import.py): DeepSpeed imported without its autotuner's
MLflow import, in a fresh interpreter (this one has imported both long ago)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[1]

CHECK = """
import sys
from vlp.platform.training.deepspeed_import import load_deepspeed
ds = load_deepspeed()
assert ds is sys.modules["deepspeed"] and load_deepspeed() is ds
assert "mlflow" not in sys.modules, "DeepSpeed's import brought MLflow in"
from deepspeed.autotuning import autotuner
assert autotuner.has_mlflow is False
assert not any(type(f).__name__ == "_NoMlflowForTheAutotuner" for f in sys.meta_path)
import mlflow                       # vlp's own tracking still imports it as usual
from mlflow.tracking import MlflowClient
print("ok", mlflow.__version__)
"""


def test_deepspeed_loads_without_mlflow_and_mlflow_still_imports():
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "\nok " in "\n" + done.stdout, done.stdout


def test_mlflow_imported_first_is_the_one_deepspeed_uses():
    code = ("import mlflow, sys\n"
            "from vlp.platform.training.deepspeed_import import load_deepspeed\n"
            "load_deepspeed()\n"
            "from deepspeed.autotuning import autotuner\n"
            "assert autotuner.has_mlflow is True and autotuner.mlflow is mlflow\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

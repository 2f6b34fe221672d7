"""``load_deepspeed`` (deepspeed_import.py): DeepSpeed imported without its autotuner's
MLflow import, with its Muon kernels compiled on first call and without building its CPU comm
op, in a fresh interpreter (this one has imported all of them long ago)."""

from __future__ import annotations

from pathlib import Path

from engine_subprocess import rank_group
from preloaded_python import fresh_python

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
    done = fresh_python(CHECK, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "\nok " in "\n" + done.stdout, done.stdout


def test_mlflow_imported_first_is_the_one_deepspeed_uses():
    code = ("import mlflow, sys\n"
            "from vlp.platform.training.deepspeed_import import load_deepspeed\n"
            "load_deepspeed()\n"
            "from deepspeed.autotuning import autotuner\n"
            "assert autotuner.has_mlflow is True and autotuner.mlflow is mlflow\n")
    done = fresh_python(code, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]


MUON = """
import sys
import torch
from vlp.platform.training.deepspeed_import import load_deepspeed
from vlp.platform.training.jit_ops_dir import use_extensions_dir
use_extensions_dir()
deepspeed = load_deepspeed()
from deepspeed.runtime import compiler
assert compiler.compile() is torch.compile          # DeepSpeed's decorator as it was
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
from deepspeed.runtime.zero.utils import ZERO_SUPPORTED_OPTIMIZERS, is_zero_supported_optimizer
from deepspeed.runtime.zero.muon import original_muon
from deepspeed.runtime.zero.muon.muon_optimizer import MuonWithAuxAdam
assert "torch._inductor" not in sys.modules, "importing Muon compiled its kernels"
adamw = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters(), fused=True)
assert is_zero_supported_optimizer(adamw)               # DeepSpeed's own check, Muon listed
assert MuonWithAuxAdam in ZERO_SUPPORTED_OPTIMIZERS
# a kernel compiles on its first call, once, with torch.compile, and computes what it did
compiled = []
def counting_compile(fn, *args, **kwargs):
    compiled.append(fn.__name__)
    return fn
torch.compile = counting_compile
g = torch.randn(6, 4)
want = original_muon.zeropower_via_newtonschulz5.__wrapped__(g, 5)
assert torch.equal(original_muon.zeropower_via_newtonschulz5(g, 5), want)
original_muon.zeropower_via_newtonschulz5(g, 5)
assert compiled == ["zeropower_via_newtonschulz5"], compiled
print("ok")
"""


def one_rank(code: str, last_line: str, **env_vars: str) -> str:
    """``code`` run as rank 0 of 1 in a fresh interpreter (``env_vars`` added to its
    environment); its stdout, which must hold ``last_line``."""
    with rank_group() as (port, env):
        env = dict(env, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port, **env_vars)
        done = fresh_python(code, cwd=REPO, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"\n{last_line}" in "\n" + done.stdout, done.stdout
    return done.stdout


def test_muon_imports_without_compiling_and_compiles_on_first_call():
    one_rank(MUON, "ok")


BF16_ENGINE = """
import os
import torch
from vlp.platform.training.deepspeed_import import load_deepspeed
load_deepspeed()
from deepspeed.runtime import bf16_optimizer, utils
from vlp.platform.pretrain.experiment_config import load_experiment_config
from vlp.platform.pretrain.run import loop_config
from vlp.platform.training.engine import build_engine
from vlp.testing.toy import ToyModel
cfg = loop_config(load_experiment_config(data={
    "data": {"sources": {"a": {"path": "/x"}}}, "tasks": {"mlm": 1},
    "train": {"steps": 2, "precision": "bf16", "zero_stage": 1},   # ZeRO-1 bf16: a GPU run
    "optimizer": {"warmup_steps": 1}}))
engine = build_engine(ToyModel(["mlm"]), cfg, stage_steps=2, world_size=1)
assert isinstance(engine.optimizer, bf16_optimizer.BF16_Optimizer), type(engine.optimizer)
assert bf16_optimizer.see_memory_usage is utils.see_memory_usage     # DeepSpeed's own again
# DeepSpeed's comm backend started without its shared-memory op, and nothing was JIT-built
from deepspeed.comm import comm
assert comm.cdb is not None and comm.cdb.shm_comm_op is None, comm.cdb
t = torch.ones(3)
comm.all_reduce(t)
assert t.tolist() == [1.0, 1.0, 1.0]
assert os.listdir(os.environ["TORCH_EXTENSIONS_DIR"]) == [], os.listdir(os.environ["TORCH_EXTENSIONS_DIR"])
print("built")
"""


def test_a_cpu_bf16_engine_is_built_without_forced_memory_reports_or_a_comm_op(tmp_path):
    """The engine's DeepSpeed memory reports (bf16 optimizer) and its CPU comm op's build
    (``deepspeed_shm_comm``: ~50 CPU s on a new machine) are both left out."""
    out = one_rank(BF16_ENGINE, "built", TORCH_EXTENSIONS_DIR=str(tmp_path))
    # DeepSpeed's forced report: "begin bf16_optimizer", "MA … GB", "CPU Virtual Memory"
    assert "bf16_optimizer" not in out and "CPU Virtual Memory" not in out, out

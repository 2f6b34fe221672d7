"""Evaluation sharded over workers equals the single-process evaluation: the retrieval score
matrix (every text × every image) with 2 real gloo ranks, and the shard/gather order for
any world size; metric wiring of every benchmark's evaluate on a tiny model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vlp.datasets.downstream import data_config_for
from vlp.models import create_model
from vlp.models.heads import DownstreamModel, build_head
from vlp.benchmarks import BenchmarkContext, get_benchmark
from vlp.benchmarks.retrieval import score_matrix
from vlp.benchmarks.eval_runner import EvalRunner
from vlp.platform.training.rendezvous import join_group, open_store

torch.set_num_threads(1)


def retrieval_model() -> DownstreamModel:
    torch.manual_seed(0)
    base, _, _ = create_model("uniter-tiny", ["itm"], region_feat_dim=64)
    return DownstreamModel(base.backbone, build_head("match-scorer", name="retrieval",
                                                     hidden=64, itm_head=base.heads["itm"]))


_INHERITED: list = []


def _forget_inherited_group() -> None:
    """A forked rank inherits this test process's default group when an in-process local run
    earlier on the same xdist worker left its one-rank group up (by design: DeepSpeed keeps
    its handle, so the parent's group must stay as it is). The child starts torch.distributed
    afresh: a new world and an empty group registry. The inherited objects are kept
    referenced and never shut down here: their gloo threads live in the parent only."""
    from torch.distributed import distributed_c10d as c10d

    if not c10d.is_initialized():
        return
    _INHERITED.append(c10d._world)
    c10d._world = c10d._World()
    c10d._unregister_all_process_groups()
    torch._C._distributed_c10d._set_global_rank(-1)


def _rank_main(rank: int, world: int, port: int, world_dir: str, out: str) -> None:
    import torch.distributed as dist

    from vlp.datasets.downstream.retrieval import RetrievalData

    _forget_inherited_group()
    join_group("gloo", "127.0.0.1", port, rank, world)
    torch.set_num_threads(1)
    _, spec, _ = create_model("uniter-tiny", ["itm"], region_feat_dim=64)
    data = RetrievalData(data_config_for(spec, world_dir), "val")
    runner = EvalRunner(retrieval_model(), rank, world, batch_size=64)
    scores = score_matrix(data, runner, pairs_per_batch=97)   # batches cross text boundaries
    if rank == 0:
        np.save(out, scores)
    else:
        assert scores is None
    dist.barrier()
    dist.destroy_process_group()


def test_two_rank_retrieval_scores_equal_one_process(tiny_world, tmp_path):
    from vlp.datasets.downstream.retrieval import RetrievalData

    out = str(tmp_path / "scores.npy")
    # fork: the ranks inherit the imported modules (spawn re-imports torch: ~20 s here)
    store = open_store()     # the ranks' rendezvous, held here (rendezvous.py says why)
    torch.multiprocessing.start_processes(_rank_main, args=(2, store.port, str(tiny_world),
                                                            out), nprocs=2, join=True,
                                          start_method="fork")
    distributed = np.load(out)
    _, spec, _ = create_model("uniter-tiny", ["itm"], region_feat_dim=64)
    data = RetrievalData(data_config_for(spec, str(tiny_world)), "val")
    single = score_matrix(data, EvalRunner(retrieval_model()), pairs_per_batch=512)
    assert distributed.shape == single.shape == (len(data), len(data.image_ids))
    np.testing.assert_allclose(distributed, single, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("world", [1, 2, 3, 7])
def test_shards_concatenate_back_to_the_single_process_order(world):
    n = 20
    parts = [EvalRunner(None, rank, world).shard(n) for rank in range(world)]
    assert np.concatenate(parts).tolist() == list(range(n))


def test_every_benchmark_evaluates_on_a_tiny_model(tiny_world):
    """The evaluate path of each registered benchmark (rank 0 of 1): metrics in percent and
    one prediction per query."""
    base, spec, _ = create_model("uniter-tiny", ["itm"], region_feat_dim=64)
    data_cfg = data_config_for(spec, str(tiny_world))
    expected = {"vqa": ["vqa_score"], "ve": ["ve_acc"], "nlvr2": ["nlvr2_acc"],
                "retrieval": ["ir_r1", "ir_r5", "ir_r10", "tr_r1", "ir_mean", "tr_mean"],
                "refcoco+": ["refcocoplus_acc"], "refcoco+-gt": ["refcocoplus-gt_acc"],
                "vcr": ["q2a", "qa2r", "q2ar"]}
    for name, keys in expected.items():
        bench = get_benchmark(name)
        ctx = BenchmarkContext(data_cfg, bench.options({}), base.family, "val", 0)
        torch.manual_seed(0)
        fresh, _, _ = create_model("uniter-tiny", ["itm"], region_feat_dim=64)
        model = DownstreamModel(fresh.backbone, bench.build_head(ctx, fresh.backbone,
                                                                 fresh.heads["itm"]))
        data = bench.eval_data(ctx)
        result = bench.evaluate(ctx, data, EvalRunner(model, batch_size=32))
        for k in keys:
            assert 0.0 <= result.metrics[k] <= 100.0, (name, k)
        queries = len(data) + (len(data.image_ids) if name == "retrieval" else 0)
        assert len(result.predictions) == queries

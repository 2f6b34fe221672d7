"""The loop's per-step all-reduce on 2 real gloo ranks (no Ray, no DeepSpeed): a NaN on one
rank is seen by every rank, differing task draws are an error, and the reported losses are
the global means."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from vlp.platform.training.rendezvous import AGENT_STORE_ENV, open_store

SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch, torch.distributed as dist
    import torch.multiprocessing as mp

    def rank_main(rank, port, queue):
        from vlp.platform.training.checkpointing import TrainerState
        from vlp.platform.training.loop import _Worker
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=2)
        w = object.__new__(_Worker)
        w.rank, w.world, w.task_ids = rank, 2, {"mlm": 0, "itm": 1, "mrfr": 2}
        state = TrainerState(step=4)
        out = {}
        loss = torch.tensor(1.0 + rank)
        acc = torch.tensor(float("nan"))
        # the step's one all-reduce: two micro-batches, 3 + rank and 2 examples on each rank
        micro = [("mlm", {"loss": loss, "mlm_loss": loss, "mlm_acc": acc}, 3 + rank, 100),
                 ("itm", {"loss": 2 * loss, "itm_loss": 2 * loss}, 2, 50)]
        stats = w._reduce_step(micro, state)
        out["agree"] = [stats["examples"], stats["input_units"], stats["loss_sum"],
                        stats["means"]]
        nan = torch.tensor(float("nan")) if rank == 1 else torch.tensor(1.0)
        try:
            w._reduce_step([("mlm", {"loss": nan}, 1, 1)], state)
            out["nan"] = None
        except FloatingPointError as e:
            out["nan"] = str(e)
        out["skip_nan"] = w._finite_everywhere("mlm", {"loss": nan}, state)
        try:
            w._reduce_step([("mlm" if rank == 0 else "itm", {"loss": loss}, 1, 1)], state)
            out["mismatch"] = None
        except RuntimeError as e:
            out["mismatch"] = str(e)
        queue.put((rank, out))
        dist.destroy_process_group()

    if __name__ == "__main__":
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        procs = [ctx.Process(target=rank_main, args=(r, sys.argv[1], q)) for r in range(2)]
        for p in procs:
            p.start()
        results = dict(q.get(timeout=120) for _ in procs)
        for p in procs:
            p.join(30)
        print("RESULT" + json.dumps(results))
""")


@pytest.mark.integration
def test_agreement_across_two_ranks(tmp_path):
    script = tmp_path / "agree.py"
    script.write_text(SCRIPT)
    store = open_store()        # the ranks' rendezvous, held here (rendezvous.py says why)
    proc = subprocess.run([sys.executable, str(script), str(store.port)], capture_output=True,
                          text=True, timeout=180, env={**os.environ, **AGENT_STORE_ENV},
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.split("RESULT", 1)[1])
    for rank in ("0", "1"):
        r = results[rank]
        examples, units, loss_sum, means = r["agree"]
        assert examples == 3 + 4 + 2 + 2 and units == 300          # summed over the ranks
        assert means["loss"] == 2.25 and loss_sum == 4.5           # global means: 1.5 and 3
        assert means["mlm_loss"] == 1.5 and means["itm_loss"] == 3.0
        assert means["mlm_acc"] == 0.0                            # a NaN accuracy is no error
        assert "non-finite loss at step 5, micro-batch 1/1" in r["nan"]  # rank 1's NaN, on both
        assert r["skip_nan"] is False                             # the skip check sees it too
        assert "ranks disagree at step 5" in r["mismatch"]
        assert "seeded identically on every rank" in r["mismatch"]

def test_resume_problem_refuses_checkpoints_of_another_experiment():
    from vlp.platform.training.checkpointing import resume_problem

    stages = [("web", 15), ("indomain", 15)]
    meta = {"step": 20, "stage": 1, "stages": [["web", 15], ["indomain", 15]], "world_size": 2}
    assert resume_problem(meta, stages, 2) is None
    assert resume_problem(meta, [("web", 15), ("indomain", 40)], 2) is None   # train longer
    assert "does not fit" in resume_problem(meta, [("web", 15), ("indomain", 4)], 2)
    assert "does not fit" in resume_problem(meta, [("web", 15), ("coco", 15)], 2)
    assert "does not fit" in resume_problem(meta, [("web", 20), ("indomain", 15)], 2)
    assert "does not fit" in resume_problem(meta, [("web", 30)], 2)
    # another worker count: resumed where the global batch (2 workers × grad_accum 1) divides
    assert resume_problem(meta, stages, 1) is None
    assert "written by 2 workers × grad_accum 1" in resume_problem(meta, stages, 4)

"""The summed objective inside a real DeepSpeed engine (ZeRO-2, two micro-batches per step, one
process): several forwards through the engine and one ``engine.backward`` of their weighted
sum update the weights exactly as one forward that computes the same total would. DeepSpeed
hooks every forward's outputs to scale gradients for accumulation; a loss built from several
forwards must be scaled once, not once per forward."""

from __future__ import annotations

import pytest

from engine_subprocess import run_one_rank

BODY = """
    from vlp.contract.batch_spec import TASK_BATCHES
    from vlp.datasets.batching.task_sampler import SummedTasks
    from vlp.models import create_model
    from vlp.testing.example_batches import example_batch
    from vlp.platform.training import objective
    from vlp.platform.training.engine import build_engine
    from vlp.platform.pretrain.experiment_config import load_experiment_config
    from vlp.platform.pretrain.run import loop_config

    MIX = {"mlm": 2, "moc": 1, "itm": 1}
    cfg = loop_config(load_experiment_config(data={
        "data": {"sources": {"a": {"path": "/x"}}}, "tasks": MIX,
        "model": {"family": "imagebert-tiny"},
        "train": {"steps": 2, "zero_stage": 2, "grad_accum": 2},
        "optimizer": {"warmup_steps": 1, "lr": 1e-3}}))
    draw = SummedTasks(MIX).next()

    class OneForward(torch.nn.Module):
        # the same total from a single forward call of the engine
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, batch, task):
            return {"loss": sum(task.weights[t] * self.model(batch[TASK_BATCHES][t], task=t)["loss"]
                                for t in task)}

    def micro(seed):
        return {TASK_BATCHES: {t: example_batch(spec, t, seed=seed * 10 + i)
                               for i, t in enumerate(MIX)}}

    params, norms = {}, {}
    for way in ("summed", "one-forward"):
        torch.manual_seed(0)
        model, spec, _ = create_model("imagebert-tiny", list(MIX), region_feat_dim=2048)
        model.eval()        # no dropout: both ways see the same function
        module = model if way == "summed" else OneForward(model)
        engine = build_engine(module, cfg, stage_steps=2, world_size=1)
        for seed in range(2):   # one optimizer step of two micro-batches
            if way == "summed":
                out = objective.forward(engine, micro(seed), draw)
            else:
                out = engine(micro(seed), task=draw)
            engine.backward(out["loss"])
            engine.step()
        params[way] = [p.detach().float().clone() for p in model.parameters()]
        norms[way] = float(engine.get_global_grad_norm())   # Adam hides a scale; this does not
        engine.destroy()
    moved = max(float((a - b).abs().max()) for a, b in zip(params["summed"],
                                                            params["one-forward"]))
    print("RESULT" + json.dumps({"max_diff": moved, "norms": norms}))
"""


@pytest.mark.integration
def test_several_forwards_one_backward_update_as_one_forward_of_the_total(tmp_path):
    out = run_one_rank(BODY, cwd=tmp_path)
    assert out["max_diff"] < 1e-6, out
    norms = out["norms"]
    assert norms["summed"] > 0 and abs(norms["summed"] - norms["one-forward"]) < 1e-5 * norms[
        "summed"], out

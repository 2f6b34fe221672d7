"""A point of the pretraining search space: which tasks in which mix, masking, data, init,
and (where the space varies it) the objective: ``sampled`` draws one task per micro-batch by
mix ratio, ``summed`` sums every task's loss on the same examples with the ratios as loss
weights (scaled to a mean of 1); "" is the model family's paper's.

    p = TrialPoint.of({"mlm": 2, "itm": 2, "mrc-kl": 1, "mrfr": 1})
    p.mix_label()          # 'MLM+ITM+MRC-kl+MRFR'   (Table 3's order)
    p.ratio_label()        # '2:2:1:1'
    TrialPoint()           # no pretraining: finetune the initialisation only (Table 3 line 1)

Points are plain, hashable data: they travel in Tune trial configs (as ``to_params``), are
logged as MLflow params and tags, and are what the leaderboard shows.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping

# a task's label and place in a mix label (Table 3's reading order: L10 reads "MLM + ITM +
# MRC-kl + MRFR", then the other families') are its task file's (``vlp.tasks``)
from vlp.tasks.registry import task_label, task_order

MASKINGS = ("conditional", "joint")
DATA_CHOICES = ("in", "out", "both")      # pretraining corpora by the world's source domains
DATA_LABELS = {"in": "In-domain", "out": "Out-of-domain", "both": "In-domain + Out-of-domain"}
INITS = ("random", "text")    # text: the text-only BERT weights of model.text_init (Table 3 L2)


@dataclass(frozen=True)
class TrialPoint:
    tasks: tuple[tuple[str, float], ...] = ()   # (task, ratio) with ratio > 0; () = no pretraining
    masking: str = "conditional"
    data: str = "in"
    init: str = "random"
    objective: str = ""       # "" = the family's (train.objective); sampled | summed

    @classmethod
    def of(cls, mix: Mapping[str, float], **kw: Any) -> "TrialPoint":
        """A point from a ``{task: ratio}`` mix (zero ratios dropped, Table 3's task order)."""
        items = sorted(((t, float(r)) for t, r in mix.items() if r > 0),
                       key=lambda tr: (task_order(tr[0]), tr[0]))
        return cls(tuple(items), **kw)

    @property
    def pretrains(self) -> bool:
        return bool(self.tasks)

    @property
    def mix(self) -> dict[str, float]:
        return dict(self.tasks)

    # ---- labels ---------------------------------------------------------------------------

    def mix_label(self) -> str:
        """``MLM+ITM+MRC-kl`` (joint masking adds ``(w/o cond. mask)`` as in Table 3)."""
        if not self.pretrains:
            return "MLM (text only)" if self.init == "text" else "None"
        label = "+".join(task_label(t) for t, _ in self.tasks)
        return label + (" (w/o cond. mask)" if self.masking == "joint" else "")

    def ratio_label(self) -> str:
        return ":".join(f"{r:g}" for _, r in self.tasks) if self.pretrains else "-"

    def data_label(self) -> str:
        if not self.pretrains:
            return "Text" if self.init == "text" else "None"
        return DATA_LABELS.get(self.data, self.data)

    def init_label(self) -> str:
        return {"random": "random", "text": "text-only BERT"}.get(self.init, self.init)

    def describe(self) -> str:
        """One line for logs: ``MLM+ITM (2:2) · In-domain · init random``."""
        if not self.pretrains:
            return f"no pretraining · init {self.init_label()}"
        weights = " loss weights" if self.objective == "summed" else ""
        objective = f" · {self.objective}" if self.objective else ""
        return (f"{self.mix_label()} ({self.ratio_label()}{weights}) · {self.data_label()} · "
                f"init {self.init_label()}{objective}")

    # ---- plain dicts (Tune configs, MLflow params) ------------------------------------------

    def to_params(self) -> dict[str, Any]:
        p = {"tasks": {t: r for t, r in self.tasks}, "masking": self.masking,
             "data": self.data, "init": self.init}
        if self.objective:   # only when set: the keys of points without one stay as they were
            p["objective"] = self.objective
        return p

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "TrialPoint":
        return cls.of(dict(params.get("tasks") or {}), masking=params.get("masking", "conditional"),
                      data=params.get("data", "in"), init=params.get("init", "random"),
                      objective=params.get("objective", ""))

    def mlflow_params(self) -> dict[str, str]:
        out = {"point.pretrains": str(self.pretrains), "point.init": self.init}
        if self.pretrains:
            out.update({"point.masking": self.masking, "point.data": self.data,
                        **{f"point.ratio.{t}": f"{r:g}" for t, r in self.tasks}})
            if self.objective:
                out["point.objective"] = self.objective
        return out

    def key(self) -> str:
        """Equal points, equal keys (how a search finds a trial it already ran)."""
        p = self.to_params()
        if not self.pretrains:       # masking and data mean nothing without pretraining
            p = {"tasks": {}, "init": self.init}
        return hashlib.sha1(json.dumps(p, sort_keys=True).encode()).hexdigest()[:16]

    def tags(self) -> dict[str, str]:
        tags = {"mix": self.mix_label(), "mix_ratios": self.ratio_label(),
                "pretraining_data": self.data_label(), "init": self.init,
                "vlp.point_key": self.key()}
        if self.objective:
            tags["objective"] = self.objective
        return tags

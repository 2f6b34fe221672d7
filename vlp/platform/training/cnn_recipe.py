"""SOHO's optimisation recipe for a model with a trainable CNN (§3.2, §4.1).

- Two optimizers in one: SGD for the CNN (lr 1e-2, weight decay 5e-4, momentum 0.9: the
  paper names SGD, lr and decay; momentum is the usual 0.9) and AdamW for everything else
  (the Transformer, the 1×1 projection, the heads: the ``optimizer`` section's lr, betas and
  decay; SOHO's configs set lr 1e-4, decay 1e-2). "The visual backbone and Transformer favor
  different kinds of optimizers."
- Cold start: the CNN is frozen for the first ``model.cold_start_steps`` optimizer steps of
  the first stage (the dictionary keeps its moving average, the projection and the
  Transformer train): "directly copying the gradient from randomly initialized embedding
  vectors to visual feature maps will lead to … mode collapse". The freeze is the CNN groups'
  learning-rate multiplier (0 during the cold start), so it lives in the scheduler's state and
  a resumed run is frozen exactly as long as an uninterrupted one. A group at lr 0 is skipped
  whole: no decay, no momentum or moment updates (they would carry frozen-time gradients into
  the first real steps).

One ``torch.optim.Optimizer`` holds both kinds of group (``algo``: ``sgd`` | ``adamw``), so
DeepSpeed (ZeRO flattens each group's parameters and calls ``step`` once) and plain torch
loops drive it the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from vlp.platform.training.lr_schedule import WarmupLinearDecay

CNN_MARKER = ".visual.resnet."     # parameter names of SOHO's ResNet trunk inside a VLPModel


class ColdStartSchedule(WarmupLinearDecay):
    """The run's schedule, times 0 for the first ``frozen_steps`` optimizer steps. Flat
    fields only: LambdaLR checkpoints a callable object's ``__dict__``."""

    def __init__(self, warmup_steps: int, total_steps: int, decay: bool, frozen_steps: int,
                 milestones: tuple[int, ...] = (), factor: float = 0.1):
        super().__init__(warmup_steps, total_steps, decay, milestones, factor)
        self.frozen_steps = frozen_steps

    def __call__(self, index: int) -> float:
        return 0.0 if index < self.frozen_steps else super().__call__(index)


class SgdAdamW(torch.optim.Optimizer):
    """Per parameter group, ``algo`` ``sgd`` (torch.optim.SGD's update: L2 decay added to the
    gradient, momentum without dampening) or ``adamw`` (torch.optim.AdamW's: decoupled decay,
    bias-corrected moments). Groups at lr 0 are skipped whole."""

    def __init__(self, groups: list[dict[str, Any]], betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, momentum: float = 0.9):
        for g in groups:
            if g.get("algo") not in ("sgd", "adamw"):
                raise ValueError(f"parameter group algo {g.get('algo')!r}: expected sgd or adamw")
        super().__init__(groups, dict(lr=1e-3, weight_decay=0.0, betas=tuple(betas), eps=eps,
                                      momentum=momentum))

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["lr"] == 0:
                continue
            update = self._sgd if group["algo"] == "sgd" else self._adamw
            for p in group["params"]:
                if p.grad is not None:
                    update(p, p.grad, group, self.state[p])
        return loss

    @staticmethod
    def _sgd(p: torch.Tensor, grad: torch.Tensor, group: dict, state: dict) -> None:
        d_p = grad.add(p, alpha=group["weight_decay"]) if group["weight_decay"] else grad
        if group["momentum"]:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = d_p.detach().clone()
            else:
                buf.mul_(group["momentum"]).add_(d_p)
            d_p = buf
        p.add_(d_p, alpha=-group["lr"])

    @staticmethod
    def _adamw(p: torch.Tensor, grad: torch.Tensor, group: dict, state: dict) -> None:
        if not state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(p)
            state["exp_avg_sq"] = torch.zeros_like(p)
        beta1, beta2 = group["betas"]
        state["step"] += 1
        t = state["step"]
        p.mul_(1 - group["lr"] * group["weight_decay"])
        state["exp_avg"].lerp_(grad, 1 - beta1)
        state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denom = (state["exp_avg_sq"].sqrt() / (1 - beta2 ** t) ** 0.5).add_(group["eps"])
        p.addcdiv_(state["exp_avg"], denom, value=-group["lr"] / (1 - beta1 ** t))


class ColdStartLR(torch.optim.lr_scheduler.LambdaLR):
    """LambdaLR that also tells the model, after every step (and on load), whether the next
    step is in the cold start: the model then runs its CNN without autograd, so the frozen
    CNN costs no backward and its gradients do not enter the global grad-norm clip."""

    def __init__(self, optimizer: torch.optim.Optimizer, multipliers: list, frozen_steps: int,
                 set_frozen: Callable[[bool], None]):
        self._frozen_steps, self._set_frozen = frozen_steps, set_frozen  # before the 1st step
        super().__init__(optimizer, multipliers)

    def step(self, *args: Any) -> None:
        super().step(*args)
        self._set_frozen(self.last_epoch < self._frozen_steps)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state.pop("_set_frozen", None)   # a callable into the model: not checkpoint state
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._set_frozen(self.last_epoch < self._frozen_steps)


@dataclass(frozen=True)
class CnnRecipe:
    """What ``deepspeed.initialize`` (or a plain loop) needs: the optimizer and the scheduler
    factory (group 0 is the Transformer's decayed group: its lr is the one the loop logs)."""
    optimizer: SgdAdamW
    multipliers: list[Callable[[int], float]]
    frozen_steps: int
    set_frozen: Callable[[bool], None]

    def scheduler(self, optimizer: torch.optim.Optimizer) -> ColdStartLR:
        return ColdStartLR(optimizer, self.multipliers, self.frozen_steps, self.set_frozen)


def has_cnn(model: torch.nn.Module) -> bool:
    return any(CNN_MARKER in "." + n for n, _ in model.named_parameters())


def build_cnn_recipe(model: torch.nn.Module, *, lr: float, betas: tuple[float, float],
                     eps: float, weight_decay: float, cnn_optimizer: str, cnn_lr: float,
                     cnn_weight_decay: float, cnn_momentum: float, cold_start_steps: int,
                     schedule: WarmupLinearDecay) -> CnnRecipe | None:
    """The recipe's optimizer for ``model``, or None when it does not apply (no CNN, or the
    CNN shares AdamW and nothing is frozen: the engine's own AdamW then does the same)."""
    if not has_cnn(model) or (cnn_optimizer == "adamw" and cold_start_steps == 0):
        return None
    rest: dict[bool, list] = {True: [], False: []}   # decayed? → parameters
    cnn: dict[bool, list] = {True: [], False: []}
    for name, p in model.named_parameters():
        if p.requires_grad:   # biases and norm weights (1-D): no decay, BERT's convention
            (cnn if CNN_MARKER in "." + name else rest)[p.ndim >= 2].append(p)
    groups = [dict(params=rest[True], algo="adamw", lr=lr, weight_decay=weight_decay),
              dict(params=rest[False], algo="adamw", lr=lr, weight_decay=0.0)]
    if cnn_optimizer == "sgd":   # torchvision's SGD recipe decays every weight, BN's too
        groups.append(dict(params=cnn[True] + cnn[False], algo="sgd", lr=cnn_lr,
                           weight_decay=cnn_weight_decay))
    else:
        groups += [dict(params=cnn[True], algo="adamw", lr=lr, weight_decay=weight_decay),
                   dict(params=cnn[False], algo="adamw", lr=lr, weight_decay=0.0)]
    groups = [g for g in groups if g["params"]]
    frozen = ColdStartSchedule(schedule.warmup_steps, schedule.total_steps, schedule.decay,
                               cold_start_steps, schedule.milestones, schedule.factor)
    cnn_ids = {id(p) for p in cnn[True] + cnn[False]}
    multipliers = [frozen if id(g["params"][0]) in cnn_ids else schedule for g in groups]
    optimizer = SgdAdamW(groups, betas=betas, eps=eps, momentum=cnn_momentum)
    holders = [m for m in model.modules() if hasattr(m, "cnn_frozen")]

    def set_frozen(frozen: bool) -> None:
        for m in holders:
            m.cnn_frozen = frozen

    return CnnRecipe(optimizer, multipliers, cold_start_steps, set_frozen)

"""ASHA whose rung records survive ``Tuner.restore``.

Tune pickles the scheduler once, with the Tuner, and never saves it with the experiment's
state (Ray 2.60 calls ``TrialScheduler.save`` nowhere), so a restored sweep would start
with empty rungs: a trial after the restore is compared only with the trials that reach the
rung after it, and one below every trial before the interrupt goes on to the end. This
scheduler writes its state to a file in the sweep's storage (local or a URI: a resubmitted
driver on another node finds it) whenever it records a result, and reads that file back
before its first decision after a restore.
"""

from __future__ import annotations

import pickle
from typing import Any

from ray.tune.schedulers import ASHAScheduler

from vlp.platform.cluster.run_storage import RunStorage

STATE_FILE = "asha_state.pkl"
_NOT_STATE = ("storage", "_read")     # where the state lives is not part of it


class PersistentASHA(ASHAScheduler):
    def __init__(self, storage: RunStorage, **kwargs: Any):
        super().__init__(**kwargs)
        self.storage = storage
        self._read = True             # a new sweep: nothing to read

    def __setstate__(self, state: dict[str, Any]) -> None:
        # unpickled from the Tuner on a restore: the rungs on file are newer than ours
        self.__dict__.update(state)
        self._read = False

    def _read_once(self) -> None:
        if self._read:
            return
        self._read = True
        if self.storage.exists(STATE_FILE):   # else interrupted before any result
            self.__dict__.update(pickle.loads(self.storage.read_bytes(STATE_FILE)))

    def _write(self) -> None:
        state = {k: v for k, v in self.__dict__.items() if k not in _NOT_STATE}
        self.storage.write_bytes(pickle.dumps(state), STATE_FILE)

    def on_trial_add(self, tune_controller: Any, trial: Any) -> None:
        self._read_once()
        super().on_trial_add(tune_controller, trial)

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict) -> str:
        self._read_once()
        action = super().on_trial_result(tune_controller, trial, result)
        self._write()
        return action

    def on_trial_complete(self, tune_controller: Any, trial: Any, result: dict) -> None:
        self._read_once()
        super().on_trial_complete(tune_controller, trial, result)
        self._write()

    def on_trial_remove(self, tune_controller: Any, trial: Any) -> None:
        self._read_once()
        self._trial_info.pop(trial.trial_id, None)
        self._write()

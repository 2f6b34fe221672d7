"""A search that never spends a trial on a point it already proposed.

TPE re-proposes good points of a small categorical space; running one again would only
re-measure seed noise at a trial's cost and show the point twice on the leaderboard (noise
is measured on purpose with ``sweep.seeds``). So each proposal is checked against the
points handed out so far; a repeat is told to the study as PRUNED (no value, so TPE counts
the region as unpromising and moves on) and the study is asked again. When
``max_redraws`` proposals in a row are repeats the space is taken as exhausted: the search
ends (Tune's ``Searcher.FINISHED``) and says so in a marker file the driver reads.

    search = DistinctPointSearch(space=SpaceSampler(space), metric="score", mode="max",
                                 sampler=sampler, exhausted_marker=storage.uri("exhausted"))

The trials are numbered by distinct point (``trial_number`` 0, 1, 2, ... → t001, t002, ...),
whatever the study's own numbers are after redraws. Everything here is pickled with the
searcher's state (``Tuner.restore``).
"""

from __future__ import annotations

from typing import Any

from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch

from vlp.platform.sweep.point import TrialPoint


class DistinctPointSearch(OptunaSearch):
    def __init__(self, *args: Any, max_redraws: int = 50, exhausted_marker: str = "",
                 **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._point_trials: dict[str, str] = {}     # point key → the Tune trial that has it
        self._max_redraws = max_redraws
        self._exhausted_marker = exhausted_marker
        self.redraws = 0                             # repeats turned away so far

    def suggest(self, trial_id: str) -> dict | str | None:
        from optuna.trial import TrialState

        for _ in range(self._max_redraws + 1):
            config = super().suggest(trial_id)
            if not isinstance(config, dict):
                return config
            key = TrialPoint.from_params(config["point"]).key()
            if key not in self._point_trials:
                self._point_trials[key] = trial_id
                return {**config, "trial_number": len(self._point_trials) - 1}
            self._ot_study.tell(self._ot_trials.pop(trial_id), state=TrialState.PRUNED)
            self.redraws += 1
        if self._exhausted_marker:
            folder, name = _split(self._exhausted_marker)
            folder.write_text(f"{len(self._point_trials)} distinct points; the next "
                              f"{self._max_redraws + 1} proposals were all repeats\n", name)
        return Searcher.FINISHED


def space_exhausted(marker: str) -> str:
    """The marker's text ('' when the search did not run out of new points)."""
    folder, name = _split(marker)
    return folder.read_text(name).strip() if folder.exists(name) else ""


def _split(marker: str):
    """The marker (a path or a URI in the sweep's storage) as (its folder's storage, name)."""
    from vlp.platform.cluster.run_storage import open_location

    folder, name = str(marker).rstrip("/").rsplit("/", 1)
    return open_location(folder), name

"""MLflow: the run handle (``mlflow_run``), which server a job records to (``choice``), rank
zero's tracker (``rank_zero``) with its bounded background queue (``background_queue``), and
the leaderboard (``leaderboard`` and its ``_stats``, ``_plot``, ``_export``)."""

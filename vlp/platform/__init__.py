"""Running experiments on a Ray cluster: ``training`` (the general loop in a Ray Train worker,
with DeepSpeed), ``pretrain`` and ``finetune`` (each builds what the loop runs), ``sweep``
(Ray Tune + Optuna over task mixes), ``curation`` (web pair filters), ``tracking`` (MLflow and
the leaderboard) and ``cluster`` (Ray attach, shared storage, console output).
"""

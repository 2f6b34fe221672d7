"""The general training loop every job runs inside a Ray Train worker, configured by its own
``LoopConfig`` (``loop_config``): ``launch`` (the Ray Train run: ``run_loop``, the tracking spec,
the resume check), ``loop`` (steps, reports, checkpoints), ``engine`` (DeepSpeed),
``checkpointing``, ``prefetch``, ``step_stats``, ``lr_schedule``, ``cnn_recipe`` (SOHO's two
optimizers), ``device_peaks`` (MFU), the ``protocols`` it is written against, and the failure
rules (``failures``, ``fail_once``). Pretraining and finetuning each build a ``LoopConfig``
from their own config; this package imports neither."""

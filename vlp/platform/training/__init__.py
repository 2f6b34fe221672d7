"""The general training loop every job runs inside a Ray Train worker: ``loop`` (steps,
reports, checkpoints), ``engine`` (DeepSpeed), ``checkpointing``, ``prefetch``, ``step_stats``,
``lr_schedule``, ``cnn_recipe`` (SOHO's two optimizers), ``device_peaks`` (MFU), the
``protocols`` it is written against, and the failure rules (``failures``, ``fail_once``,
``init_weights_check``). Pretraining and finetuning each build what it runs."""

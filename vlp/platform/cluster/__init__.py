"""Where a job runs: attaching to or starting Ray (``ray_session``), the run's shared storage
by URI (``run_storage``) and the console routing of Ray's output (``console``)."""

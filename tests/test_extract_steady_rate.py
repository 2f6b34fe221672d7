"""The extraction job's steady rate is the model stage's: images after each actor's first
batch (its warm-up), over the time from the first of those batches' start to the last one's
end, as the model actors timed them. Results reach the driver a shard at a time and in
bursts, so a window over their arrivals read 3-7x the model's own rate on a CPU (48 images,
2 actors: 28.97 and 72.4 images/s against 9.7 alone); this one cannot exceed the work done."""

from __future__ import annotations

import pytest


@pytest.mark.integration
def test_the_steady_rate_counts_the_model_stage_after_its_warm_up(ray_local, tmp_path):
    from vlp.models.vision.extractors.base import ExtractSettings
    from vlp.platform.extract import extract_job
    from vlp.platform.extract.model_rate import write_images

    images, batch = 24, 4
    write_images(tmp_path / "images", images)
    opts = extract_job.ExtractOptions(
        images=str(tmp_path / "images"), image_list=None, model="grid-tiny", weights="random",
        source="bench", split="train", out=str(tmp_path / "world"),
        settings=ExtractSettings(short_side=64, long_side=96), batch_size=batch, gpus=0,
        workers=1, images_per_shard=8)
    report = extract_job.run(extract_job.plan(opts), progress_every_s=1e9)
    assert report.written == images and not report.failed and report.shards == images // 8
    # one actor: every batch but its first
    assert report.steady_images == images - batch
    assert 0 < report.steady_seconds < report.seconds

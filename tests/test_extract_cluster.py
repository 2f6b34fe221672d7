"""`vlp data extract` on a 3-node Ray cluster started as users start one (`ray start --head`
with no CPUs, like cluster.yaml's head, and two worker nodes), moto's S3 server as the only
shared storage: images read from `s3://`, shards written to `s3://` by the workers (on the
worker nodes, not the driver's), the driver receiving only names and counts (a spy on what
its dataset iterator yields), the manifest in the bucket, and a rerun that extracts only the
images not yet there. A relative `--out` on this cluster is refused before anything starts.

The cluster is this file's own (its own token, ports and temp dir), stopped by killing its
own process groups."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
import uuid

import numpy as np
import pytest
from cluster_helpers import BIN, ROOT, Cluster
from PIL import Image

BUCKET = "extract-cluster"

DRIVER = textwrap.dedent("""
    import json, sys
    from vlp.platform.extract import extract_job
    seen = []
    real = extract_job._batches
    def spy(ds):
        for batch in real(ds):
            seen.append({"columns": batch.column_names, "nbytes": batch.nbytes,
                         "nodes": sorted({n for n in batch.column("node").to_pylist() if n})})
            yield batch
    extract_job._batches = spy
    from vlp.cli import main
    for args in json.loads(sys.argv[1]):     # one driver process, attached once, runs each
        seen.clear()
        code = main(args)
        import ray
        here = ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
        print("SPY", json.dumps({"seen": seen, "driver_node": here, "exit": code}), flush=True)
""")

ARGS = ["--model", "grid-tiny", "--grid", "4", "--short-side", "64", "--long-side", "96",
        "--batch-size", "2", "--workers", "2", "--images-per-shard", "2", "--source", "web"]


@pytest.fixture(scope="module")
def s3(s3_server):
    s3_server.create_bucket(BUCKET)
    fs = s3_server.filesystem()
    rng = np.random.default_rng(0)
    for i in range(6):
        h, w = (48 + 8 * i, 64) if i % 2 else (64, 40 + 8 * i)
        buf = io.BytesIO()
        Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8)).save(buf, "JPEG")
        with fs.open_output_stream(f"{BUCKET}/imgs/photo{i}.jpg") as f:
            f.write(buf.getvalue())
    return s3_server


@pytest.fixture(scope="module")
def cluster(s3, tmp_path_factory):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(ROOT),
               RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=uuid.uuid4().hex,
               RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1",
               RAY_memory_monitor_refresh_ms="0", RAY_DATA_DISABLE_PROGRESS_BARS="1", **s3.env)
    env.pop("AWS_ENDPOINT_URL_S3", None)
    c = Cluster(env, tmp_path_factory.mktemp("ray"), head_cpus=0,
                nodes=(("node_b", 2), ("node_c", 2)))
    try:
        yield c
    finally:
        c.stop()


def _drivers(cluster, *runs: list[str]) -> tuple[list[dict], str]:
    env = {**cluster.env, "RAY_ADDRESS": f"127.0.0.1:{cluster.port}"}
    argv = json.dumps([["data", "extract", *args] for args in runs])
    proc = subprocess.run([sys.executable, "-c", DRIVER, argv], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    spies = [json.loads(ln[4:]) for ln in proc.stdout.splitlines() if ln.startswith("SPY ")]
    assert len(spies) == len(runs), proc.stdout[-3000:] + proc.stderr[-3000:]
    return spies, proc.stdout + proc.stderr


def test_workers_write_shards_to_s3_and_a_rerun_skips_them(cluster, s3, s3_env, tmp_path):
    from vlp.datasets.storage.shards import list_shards, read_image_shard
    from vlp.datasets.storage.world import load_manifest

    out = f"s3://{BUCKET}/world"
    listing = tmp_path / "first.txt"
    listing.write_text("".join(f"s3://{BUCKET}/imgs/photo{i}.jpg\n" for i in range(4)))
    # the first four images; then the whole folder (the rerun extracts only the other two);
    # then a relative --out, on the driver's node only: refused before any worker starts
    (first, rerun, relative), log = _drivers(
        cluster, ["--image-list", str(listing), "--out", out, *ARGS],
        ["--images", f"s3://{BUCKET}/imgs", "--out", out, *ARGS],
        ["--images", f"s3://{BUCKET}/imgs", "--out", "world", *ARGS])
    assert first["exit"] == 0 and rerun["exit"] == 0, log[-3000:]
    assert "4 images written" in log
    assert "2 images written" in log and "(4 skipped as already extracted, 0 failed)" in log
    # the driver saw names and counts only: no feature column, a few hundred bytes a batch
    for batch in first["seen"] + rerun["seen"]:
        assert set(batch["columns"]) == {"shard", "rows", "feature_dim", "num_classes",
                                         "node", "location", "error", "warm_images",
                                         "warm_start", "warm_end"}
        assert batch["nbytes"] < 4096
    writers = {n for b in first["seen"] + rerun["seen"] for n in b["nodes"]}
    assert writers and first["driver_node"] not in writers    # written on the worker nodes

    shards = list_shards(f"{out}/images/web")
    assert shards and all(str(f).startswith(f"{out}/images/web/train-") for f in shards)
    ids = set()
    for f in shards:
        table, info = read_image_shard(f)       # validated, content hash checked
        assert info.feature_extractor == "grid-tiny"
        ids |= set(table.column("image_id").to_pylist())
    assert ids == {f"photo{i}" for i in range(6)}
    world = load_manifest(out)
    assert world.sources["web"].images == 6
    assert sorted(f"{out}/{f}" for v in world.sources["web"].files.values() for f in v) == \
        sorted(map(str, shards))

    assert relative["exit"] == 2 and relative["seen"] == []
    assert "--out 'world' is a relative path" in log and "this job spans nodes" in log

"""cluster.yaml, checked offline: Ray's own schema, then the free-form AWS parts Ray does not
check (node_config and provider keys are passed to EC2 as they are; a typo there only shows
up as a failed `ray up`, which has no dry run)."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

# boto3 EC2 create_instances parameters used in Ray AWS configs (plus Ray's SubnetIds)
EC2_NODE_CONFIG_KEYS = {
    "InstanceType", "ImageId", "KeyName", "SubnetIds", "SubnetId", "SecurityGroupIds",
    "BlockDeviceMappings", "InstanceMarketOptions", "IamInstanceProfile", "Placement",
    "NetworkInterfaces", "TagSpecifications", "UserData", "EbsOptimized", "MetadataOptions",
    "CapacityReservationSpecification", "LaunchTemplate", "CpuOptions"}
AWS_PROVIDER_KEYS = {"type", "region", "availability_zone", "cache_stopped_nodes",
                     "use_internal_ips", "security_group", "key_pair", "use_fsx"}
# instance type → GPUs (the types cluster.yaml may use; extend when adding one)
INSTANCE_GPUS = {"m6i.2xlarge": 0, "m6i.8xlarge": 0, "g5.2xlarge": 1, "g5.12xlarge": 4,
                 "g5.48xlarge": 8, "p4d.24xlarge": 8, "p5.48xlarge": 8}


@pytest.fixture(scope="module")
def cfg() -> dict:
    return yaml.safe_load((ROOT / "cluster.yaml").read_text())


def test_valid_for_ray(cfg):
    from ray.autoscaler._private.util import prepare_config, validate_config
    validate_config(prepare_config(copy.deepcopy(cfg)))


def test_provider(cfg):
    provider = cfg["provider"]
    assert provider["type"] == "aws"
    assert set(provider) <= AWS_PROVIDER_KEYS, set(provider) - AWS_PROVIDER_KEYS
    assert re.fullmatch(r"[a-z]{2}-[a-z]+-\d", provider["region"])
    for zone in provider["availability_zone"].split(","):
        assert re.fullmatch(re.escape(provider["region"]) + r"[a-z]", zone), zone


def test_node_types(cfg):
    types = cfg["available_node_types"]
    head = types[cfg["head_node_type"]]
    assert head["resources"] == {"CPU": 0}, "no training work on the head"
    assert INSTANCE_GPUS[head["node_config"]["InstanceType"]] == 0
    gpu_types = 0
    for name, t in types.items():
        nc = t["node_config"]
        assert set(nc) <= EC2_NODE_CONFIG_KEYS, (name, set(nc) - EC2_NODE_CONFIG_KEYS)
        assert nc["InstanceType"] in INSTANCE_GPUS, (name, nc["InstanceType"])
        assert nc["ImageId"].startswith(("ami-", "resolve:ssm:/")), name
        for bd in nc.get("BlockDeviceMappings", []):
            assert set(bd) == {"DeviceName", "Ebs"} and bd["DeviceName"].startswith("/dev/")
            assert set(bd["Ebs"]) <= {"VolumeSize", "VolumeType", "Iops", "Throughput",
                                      "DeleteOnTermination", "Encrypted"}
            assert bd["Ebs"]["VolumeType"] in {"gp3", "gp2", "io1", "io2"}
            assert isinstance(bd["Ebs"]["VolumeSize"], int) and bd["Ebs"]["VolumeSize"] >= 100
        if "InstanceMarketOptions" in nc:
            assert nc["InstanceMarketOptions"] == {"MarketType": "spot"}, name
        if "IamInstanceProfile" in nc:
            assert len(nc["IamInstanceProfile"]) == 1
            assert set(nc["IamInstanceProfile"]) <= {"Name", "Arn"}
        if name != cfg["head_node_type"]:
            assert 0 <= t["min_workers"] <= t["max_workers"] <= cfg["max_workers"], name
            gpu_types += INSTANCE_GPUS[nc["InstanceType"]] > 0
    assert gpu_types >= 2, "autoscaling GPU worker types (single-GPU and multi-GPU)"


def test_setup_installs_torch_then_the_project(cfg):
    cmds = cfg["setup_commands"]
    torch = next(i for i, c in enumerate(cmds) if "torch==" in c)
    project = next(i for i, c in enumerate(cmds) if "install" in c and "-e ~/vlp" in c)
    assert torch < project
    assert cfg["file_mounts"]["~/vlp"] == "."  # `ray up` runs from the repository root
    assert (ROOT / "pyproject.toml").exists()


def test_token_auth_without_secrets_in_the_config(cfg):
    assert cfg["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        start = next(c for c in cfg[key] if "ray start" in c)
        assert "export RAY_AUTH_MODE=token;" in start, key
    assert "RAY_AUTH_TOKEN=" not in (ROOT / "cluster.yaml").read_text()


def test_head_starts_mlflow_on_the_private_address(cfg):
    start = " ".join(cfg["head_start_ray_commands"])
    server = start[start.index("mlflow server"):]
    backend = re.search(r"--backend-store-uri (\S+)", server).group(1)
    assert backend.startswith(("sqlite:////", "sqlite:///$HOME/", "postgresql://"))
    assert re.search(r"--artifacts-destination s3://[a-z0-9.-]{3,63}/", server)
    assert "HEAD_IP=$(hostname -I | cut -d' ' -f1)" in start
    assert "--host $HEAD_IP" in server and "0.0.0.0" not in start
    assert "--allowed-hosts" in server
    assert "--dashboard-host=127.0.0.1" in start
    assert start.index("mlflow server") < start.index("ray start --head")

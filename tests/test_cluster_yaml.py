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
                 "g5.48xlarge": 8, "g6.2xlarge": 1, "g6.12xlarge": 4, "p4d.24xlarge": 8,
                 "p5.48xlarge": 8}
# instance family → the GPU as Ray names it (what EC2's GpuInfo and the node itself report)
FAMILY_ACCELERATOR = {"g5": "A10G", "g6": "L4", "p4d": "A100", "p5": "H100"}
CONFIGS = ROOT / "jobs" / "configs"


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
    zones = provider["availability_zone"].split(",")
    assert len(zones) == 1, "GPU nodes in one zone: NCCL across zones is slow and billed"
    assert re.fullmatch(re.escape(provider["region"]) + r"[a-z]", zones[0]), zones


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


# ---- the fixes of issue 16 (item 7) --------------------------------------------------------

def worker_types(cfg):
    return {n: t for n, t in cfg["available_node_types"].items() if n != cfg["head_node_type"]}


def gpus(t) -> int:
    return INSTANCE_GPUS[t["node_config"]["InstanceType"]]


def is_spot(t) -> bool:
    return t["node_config"].get("InstanceMarketOptions", {}).get("MarketType") == "spot"


def accelerator(t) -> str | None:
    names = [k.split(":", 1)[1] for k in t.get("resources", {})
             if k.startswith("accelerator_type:")]
    assert len(names) <= 1, names
    return names[0] if names else None


def test_head_has_its_own_profile_whose_role_may_pass_the_workers_role(cfg):
    import fnmatch
    import json

    head = cfg["available_node_types"][cfg["head_node_type"]]["node_config"]
    head_profile = head["IamInstanceProfile"]["Name"]
    assert head_profile != "ray-autoscaler-v1", "Ray's auto-created role has no iam:PassRole"
    policy = json.loads((ROOT / "docs" / "iam" / f"{head_profile}-policy.json").read_text())
    passable = [r for st in policy["Statement"] if st["Effect"] == "Allow"
                and "iam:PassRole" in ([st["Action"]] if isinstance(st["Action"], str)
                                       else st["Action"])
                for r in ([st["Resource"]] if isinstance(st["Resource"], str) else st["Resource"])]
    for name, t in worker_types(cfg).items():
        profile = t["node_config"].get("IamInstanceProfile", {}).get("Name")
        if profile is None:
            continue
        assert profile != "ray-autoscaler-v1", name
        role_arn = f"arn:aws:iam::123456789012:role/{profile}"   # role named as its profile
        assert any(fnmatch.fnmatchcase(role_arn, r) for r in passable), (name, passable)
        assert (ROOT / "docs" / "iam" / f"{profile}-policy.json").is_file(), profile
    docs = (ROOT / "docs/cluster.md").read_text()
    assert "aws iam create-instance-profile" in docs
    assert re.search(rf"for name in {head_profile} \S+; do", docs)


def test_each_gpu_type_declares_the_one_accelerator_it_has(cfg):
    from vlp.platform.pretrain.experiment_config import ACCELERATOR_TYPES

    for name, t in worker_types(cfg).items():
        kind = accelerator(t)
        if gpus(t) == 0:
            assert kind is None, name
            continue
        family = t["node_config"]["InstanceType"].split(".")[0]
        assert kind == FAMILY_ACCELERATOR[family], (name, kind)
        assert kind in ACCELERATOR_TYPES and t["resources"][f"accelerator_type:{kind}"] == 1


def test_spot_only_for_single_gpu_types_and_never_beside_on_demand_of_that_gpu(cfg):
    by_kind: dict[str, set[bool]] = {}
    for name, t in worker_types(cfg).items():
        if is_spot(t):
            assert gpus(t) <= 1, f"{name}: multi-GPU data-parallel nodes run on demand"
        if accelerator(t):
            by_kind.setdefault(accelerator(t), set()).add(is_spot(t))
    # a data-parallel config asks for a GPU type, so it must never land on a spot node
    assert all(len(markets) == 1 for markets in by_kind.values()), by_kind


def gpu_scalings():
    """(what, scaling dict) of every GPU run the configs describe: pretraining configs, a
    sweep's trial pretraining and its finetunes (their `scaling.*` overrides)."""
    for path in sorted(CONFIGS.glob("*.yaml")):
        raw = yaml.safe_load(path.read_text())
        if raw.get("scaling", {}).get("use_gpu"):
            yield path.name, raw["scaling"]
        pre = (raw.get("pretrain") or {}).get("scaling", {})
        if pre.get("use_gpu"):
            yield f"{path.name} pretrain", pre
        ft = raw.get("finetune") or {}
        if isinstance(ft, dict) and ft.get("use_gpu"):
            sets = dict(o.split("=", 1) for o in ft.get("overrides", []) if "=" in o)
            yield f"{path.name} finetune", {
                "num_workers": ft.get("num_workers", 1), "use_gpu": True,
                "accelerator_type": sets.get("scaling.accelerator_type", "")}


def test_every_gpu_config_asks_for_a_gpu_type_the_cluster_has_enough_of(cfg):
    seen = 0
    for what, scaling in gpu_scalings():
        seen += 1
        kind = scaling.get("accelerator_type")
        assert kind, f"{what}: set scaling.accelerator_type (a run on one GPU type, not a mix)"
        types = [t for t in worker_types(cfg).values() if accelerator(t) == kind]
        assert types, f"{what}: no node type of cluster.yaml has {kind}"
        capacity = sum(gpus(t) * t["max_workers"] for t in types)
        assert scaling["num_workers"] <= capacity, (what, kind, capacity)
        if scaling["num_workers"] > 1:
            assert not any(is_spot(t) for t in types), f"{what}: data-parallel on spot nodes"
    assert seen >= 6


def test_gpu_configs_read_big_files_from_the_shared_mount(cfg):
    setup = " ".join(cfg["setup_commands"])
    assert "mount-s3 --read-only --prefix shared/ $VLP_BUCKET /mnt/shared" in setup
    for path in sorted(CONFIGS.glob("*.yaml")):
        raw = yaml.safe_load(path.read_text())
        if not raw.get("scaling", {}).get("use_gpu"):
            continue
        files = [s["path"] for s in raw["data"]["sources"].values()]
        files += [raw["model"].get("init_path"), raw["data"].get("tokenizer_path")]
        for f in filter(None, files):
            assert f.startswith("/mnt/shared/"), f"{path.name}: {f} would ship in the job"


def test_the_bucket_is_named_once_and_the_policies_grant_it(cfg):
    import json

    text = (ROOT / "cluster.yaml").read_text()
    bucket = re.search(r"export VLP_BUCKET=([a-z0-9.-]{3,63})", text).group(1)
    assert text.count(bucket) == 1
    for f in (ROOT / "docs" / "iam").glob("*-policy.json"):
        assert f"arn:aws:s3:::{bucket}/*" in json.dumps(json.loads(f.read_text())), f.name


def mlflow_unit(cfg, head_ip: str = "10.0.1.23", bucket: str = "my-bucket") -> str:
    """The systemd unit the head's setup writes, generated by running its command in bash
    with the privileged steps replaced."""
    import subprocess

    cmd = next(c for c in cfg["head_setup_commands"] if "vlp-mlflow.service" in c)
    cmd = cmd[:cmd.index(" && sudo systemctl")]
    cmd = (cmd.replace("HEAD_IP=$(hostname -I | cut -d' ' -f1)", f"HEAD_IP={head_ip}")
              .replace("mkdir -p ~/mlflow && ", "")
              .replace("> ~/mlflow/tracking_uri", "> /dev/null")
              .replace("sudo tee /etc/systemd/system/vlp-mlflow.service > /dev/null", "cat"))
    done = subprocess.run(["bash", "-c", f"VLP_BUCKET={bucket}\n{cmd}"], capture_output=True,
                          text=True, check=True)
    return done.stdout


def test_mlflow_runs_on_postgres_with_s3_artifacts_and_restarts(cfg):
    head = " ".join(cfg["head_setup_commands"])
    assert "apt-get install -y -qq postgresql" in head and "psycopg2" in head
    unit = mlflow_unit(cfg)
    lines = unit.splitlines()
    assert "Restart=always" in lines and "WantedBy=multi-user.target" in lines
    assert "After=network-online.target postgresql.service" in lines
    exec_start = next(line for line in lines if line.startswith("ExecStart="))
    assert "--backend-store-uri postgresql+psycopg2://ubuntu@/mlflow?host=/var/run/postgresql" in exec_start
    assert "--artifacts-destination s3://my-bucket/mlflow" in exec_start
    assert "--host 10.0.1.23 " in exec_start and "0.0.0.0" not in unit
    assert "sqlite" not in unit and "password" not in unit.lower()
    # no MLflow job runner beside the server (vlp submits no MLflow job): server_env.py
    from vlp.platform.tracking.server_env import SERVER_ENV

    for key, value in SERVER_ENV.items():
        assert f"Environment={key}={value}" in lines, key
    assert "systemctl enable --now vlp-mlflow" in head
    start = " ".join(cfg["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in start and "mlflow server" not in start


def test_ssh_sessions_and_commands_carry_the_token_mode(cfg):
    assert any("export RAY_AUTH_MODE=token' >> ~/.bashrc" in c for c in cfg["setup_commands"])


def test_rsync_keeps_out_what_rayignore_keeps_out(cfg):
    ignored = [line.strip().lstrip("/") for line in (ROOT / ".rayignore").read_text().splitlines()
               if line.strip().startswith("/")]
    excluded = {e.removeprefix("**/") for e in cfg["rsync_exclude"]}
    assert set(ignored) - {"build"} <= excluded, set(ignored) - excluded


def test_the_dashboard_is_reached_the_same_way_everywhere():
    """It listens on the head's 127.0.0.1: `ray dashboard cluster.yaml` forwards it, and every
    job header, help text and doc submits to http://127.0.0.1:8265."""
    files = ([*ROOT.glob("jobs/*.py"), *ROOT.glob("vlp/commands/*.py"),
              *CONFIGS.glob("*.yaml"), ROOT / "docs" / "cluster.md", ROOT / "cluster.yaml"])
    files.append(ROOT / "README.md")
    texts = {str(f.relative_to(ROOT)): f.read_text() for f in files}
    submits = 0
    for name, text in texts.items():
        assert "HEAD:8265" not in text, name
        for address in re.findall(r"ray job \w+ --address (\S+)", text):
            assert address == "http://127.0.0.1:8265", (name, address)
            submits += 1
    assert submits >= 10
    assert "ray dashboard cluster.yaml" in texts["docs/cluster.md"]


# ---- issue 27: storage, tracking and NCCL right by default on every node -------------------

def test_every_node_gets_s3_run_storage_and_the_heads_tracking_server(cfg, tmp_path):
    """What ~/.bashrc gives `ray start` (so every job driver and worker) and an SSH session,
    on the head and on a worker: checkpoints in the bucket, MLflow on the head's server at
    the address and port it listens on, NCCL sockets never on lo/docker."""
    import subprocess

    from cluster_helpers import bashrc_env

    worker = bashrc_env(cfg["setup_commands"], tmp_path / "worker", "my-bucket", "10.0.1.23")
    head = bashrc_env(cfg["setup_commands"], tmp_path / "head", "my-bucket")
    for env in (worker, head):
        assert env["VLP_STORAGE"] == "s3://my-bucket/runs"
        assert env["RAY_AUTH_MODE"] == "token"
        assert env["NCCL_SOCKET_IFNAME"] == "^lo,docker"
        assert "FI_PROVIDER" not in env      # no EFA device on this machine
    assert worker["MLFLOW_TRACKING_URI"] == "http://10.0.1.23:5000"
    own_ip = subprocess.run(["bash", "-c", "hostname -I | cut -d' ' -f1"], capture_output=True,
                            text=True, check=True).stdout.strip()
    assert head["MLFLOW_TRACKING_URI"] == f"http://{own_ip}:5000"
    unit = mlflow_unit(cfg, head_ip=own_ip)       # the server listens there
    assert f"--host {own_ip} --port 5000" in unit
    # a second `ray up` rewrites the tracking line instead of adding another
    again = bashrc_env(cfg["setup_commands"] * 2, tmp_path / "twice", "b", "10.0.1.24")
    assert again["MLFLOW_TRACKING_URI"] == "http://10.0.1.24:5000"
    assert (tmp_path / "twice" / ".bashrc").read_text().count("MLFLOW_TRACKING_URI") == 1


def test_the_a100_type_has_efa_and_a_cluster_placement_group(cfg):
    """Multi-node A100 runs all-reduce across nodes: four EFA interfaces (one per network
    card of a p4d), each naming its subnet and security group as Ray requires, in a cluster
    placement group; EFA's libfabric provider is set where the node has an EFA device."""
    from ray.autoscaler._private.aws.config import _configure_node_type_from_network_interface

    p4d = [t for t in worker_types(cfg).values()
           if t["node_config"]["InstanceType"] == "p4d.24xlarge"]
    assert len(p4d) == 1
    nc = p4d[0]["node_config"]
    nics = nc["NetworkInterfaces"]
    assert sorted(n["NetworkCardIndex"] for n in nics) == [0, 1, 2, 3]
    assert all(n["InterfaceType"] == "efa" and n["SubnetId"] and n["Groups"] for n in nics)
    assert [n["DeviceIndex"] for n in nics] == [0, 1, 1, 1]
    assert nc["Placement"]["GroupName"]
    # Ray's own step that takes the subnet and groups from the interfaces accepts it
    _configure_node_type_from_network_interface(p4d[0])
    setup = " ".join(cfg["setup_commands"])
    assert "/sys/class/infiniband" in setup and "FI_PROVIDER=efa" in setup
    docs = (ROOT / "docs/cluster.md").read_text()
    assert nc["Placement"]["GroupName"] in docs and "aws ec2 create-placement-group" in docs


# ---- what docs/cluster.md promises, read from its node-type table and set-up paragraph ------

def docs_node_table() -> dict[str, dict[str, str]]:
    """docs/cluster.md's node-type table: node type → its cells by column heading."""
    lines = [l for l in (ROOT / "docs" / "cluster.md").read_text().splitlines()
             if l.startswith("| ")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    assert head[:5] == ["node type", "instance", "GPUs", "market", "`accelerator_type`"], head
    rows = {}
    for line in lines[1:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if not cells[0].startswith("`") or len(cells) != len(head):
            break                                  # the next table of the page
        rows[cells[0].strip("`")] = dict(zip(head, cells))
    return rows


def test_node_types_are_the_ones_the_docs_promise(cfg):
    """Each documented node type exists with the documented instance, GPU count, market and
    accelerator resource, and no undocumented type exists (new ones go into the table)."""
    table = docs_node_table()
    types = cfg["available_node_types"]
    assert set(table) == set(types), set(table) ^ set(types)
    assert table[cfg["head_node_type"]]["GPUs"] == "—"
    for name, row in table.items():
        t = types[name]
        assert t["node_config"]["InstanceType"] == row["instance"], name
        count = re.match(r"(\d+)× (\S+)", row["GPUs"])
        assert gpus(t) == (int(count.group(1)) if count else 0), name
        assert is_spot(t) == (row["market"] == "spot"), name
        assert row["market"] in ("spot", "on demand"), name
        kind = row["`accelerator_type`"].strip("`")
        assert accelerator(t) == (None if kind == "—" else kind), name
        if count:                                  # "8× A100 40 GB": the GPU it declares
            assert count.group(2) == kind, name
    head = types[cfg["head_node_type"]]
    assert "no training work: `CPU: 0`" in table[cfg["head_node_type"]]["for"]
    assert head["resources"] == {"CPU": 0}


def test_setup_is_what_the_docs_promise(cfg):
    """docs/cluster.md: Python 3.11 in ~/vlp-venv, torch pinned to the version it names (the
    CUDA build from PyPI), then the repository synced to ~/vlp installed editable."""
    docs = (ROOT / "docs" / "cluster.md").read_text()
    pinned = re.search(r"`torch==([\d.]+)`", docs).group(1)
    setup = cfg["setup_commands"]
    assert any(f"torch=={pinned}" in c for c in setup), pinned
    assert any("--python 3.11 ~/vlp-venv" in c for c in setup)
    torch_at = next(i for i, c in enumerate(setup) if f"torch=={pinned}" in c)
    project_at = next(i for i, c in enumerate(setup) if "pip install" in c and "-e ~/vlp" in c)
    assert "~/vlp-venv/bin/pip" in setup[torch_at] and torch_at < project_at
    assert all("--index-url" not in c and "download.pytorch.org" not in c
               for c in setup if "torch==" in c), "the CUDA build from PyPI"
    assert "resolve:ssm:/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-" \
           "ubuntu-22.04" in (ROOT / "cluster.yaml").read_text()
    for name, t in cfg["available_node_types"].items():
        assert "base-oss-nvidia-driver-gpu-ubuntu-22.04" in t["node_config"]["ImageId"], name

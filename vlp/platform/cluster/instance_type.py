"""The EC2 instance type of this node, for the expected network rate (link_speeds.py).

``$VLP_INSTANCE_TYPE`` when set (another cloud, or a test); else, only on a machine whose
firmware says it is an EC2 instance, the instance metadata service (IMDSv2: a token, then
the type; half a second at most). Anywhere else: None, without a network call.
"""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

ENV = "VLP_INSTANCE_TYPE"
DMI_VENDOR = "/sys/devices/virtual/dmi/id/sys_vendor"
IMDS = "http://169.254.169.254/latest"


def on_ec2(vendor_file: str | Path | None = None) -> bool:
    try:
        return "amazon" in Path(vendor_file or DMI_VENDOR).read_text().lower()
    except OSError:
        return False


def instance_type(timeout_s: float = 0.5) -> str | None:
    given = os.environ.get(ENV, "").strip()
    if given:
        return given
    if not on_ec2():
        return None
    try:
        token = urllib.request.urlopen(urllib.request.Request(
            f"{IMDS}/api/token", method="PUT",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"}), timeout=timeout_s).read()
        with urllib.request.urlopen(urllib.request.Request(
                f"{IMDS}/meta-data/instance-type",
                headers={"X-aws-ec2-metadata-token": token.decode()}), timeout=timeout_s) as r:
            return r.read().decode().strip() or None
    except OSError:      # IMDS off or hop limit too low (a container): unknown, said
        return None

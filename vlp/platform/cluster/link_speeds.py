"""What an all-reduce's bus bandwidth should reach, by GPU (within a node) and by instance
type (between nodes), from the vendors' published link rates.

Bus bandwidth is NCCL's figure (nccl-tests' PERFORMANCE.md): the algorithm bandwidth (bytes
÷ seconds) × 2(n−1)/n for an all-reduce of n ranks, which makes it comparable with the
rate of the slowest link whatever the rank count. A ring all-reduce moves 2(n−1)/n of the
buffer over every link, so a healthy one approaches:
- within a node, one direction of the GPU-to-GPU link (NVLink, else PCIe);
- between nodes, one direction of the node's network (every ring crosses each node
  boundary once, and NCCL spreads its rings over the node's NICs).

Rates are the nominal one-direction figures, in GB/s (10⁹ bytes): NVIDIA's datasheets give
NVLink and PCIe as bidirectional totals (halved here); AWS gives a node's network in Gbit/s
(÷ 8). A measurement below ``WARN_FRACTION`` of them means a slower path was taken (NCCL on
TCP sockets instead of EFA, PCIe through the host instead of NVLink): NCCL's own tests reach
most of the nominal rate on a healthy link.
"""

from __future__ import annotations

from dataclasses import dataclass

WARN_FRACTION = 0.5


@dataclass(frozen=True)
class LinkSpeed:
    gb_per_s: float      # nominal, one direction
    link: str            # what carries it, for the line
    source: str          # where the figure comes from


# GPU-to-GPU within a node, by ``torch.cuda.get_device_name``'s exact name
WITHIN_NODE: dict[str, LinkSpeed] = {
    "NVIDIA A100-SXM4-40GB": LinkSpeed(300.0, "NVLink 3", "NVIDIA A100 datasheet: 600 GB/s"),
    "NVIDIA A100-SXM4-80GB": LinkSpeed(300.0, "NVLink 3", "NVIDIA A100 datasheet: 600 GB/s"),
    "NVIDIA H100 80GB HBM3": LinkSpeed(450.0, "NVLink 4", "NVIDIA H100 datasheet: 900 GB/s"),
    "NVIDIA H200": LinkSpeed(450.0, "NVLink 4", "NVIDIA H200 datasheet: 900 GB/s"),
    "Tesla V100-SXM2-16GB": LinkSpeed(150.0, "NVLink 2", "NVIDIA V100 datasheet: 300 GB/s"),
    "Tesla V100-SXM2-32GB": LinkSpeed(150.0, "NVLink 2", "NVIDIA V100 datasheet: 300 GB/s"),
    # no NVLink: GPU to GPU over PCIe
    "NVIDIA A10G": LinkSpeed(32.0, "PCIe Gen4 x16",
                             "PCIe Gen4 x16: 64 GB/s (AWS publishes no A10G datasheet; the "
                             "A10's)"),
    "NVIDIA A10": LinkSpeed(32.0, "PCIe Gen4 x16", "NVIDIA A10 datasheet: 64 GB/s"),
    "NVIDIA L4": LinkSpeed(32.0, "PCIe Gen4 x16", "NVIDIA L4 datasheet: 64 GB/s"),
    "NVIDIA L40S": LinkSpeed(32.0, "PCIe Gen4 x16", "NVIDIA L40S datasheet: 64 GB/s"),
    "Tesla T4": LinkSpeed(16.0, "PCIe Gen3 x16", "NVIDIA T4 datasheet: 32 GB/s"),
}

# a node's network, by EC2 instance type (AWS's instance type pages, Gbit/s)
BETWEEN_NODES: dict[str, LinkSpeed] = {
    "p4d.24xlarge": LinkSpeed(50.0, "EFA 4 × 100 Gbit/s", "AWS EC2 P4: 400 Gbit/s"),
    "p4de.24xlarge": LinkSpeed(50.0, "EFA 4 × 100 Gbit/s", "AWS EC2 P4: 400 Gbit/s"),
    "p5.48xlarge": LinkSpeed(400.0, "EFA 32 × 100 Gbit/s", "AWS EC2 P5: 3200 Gbit/s"),
    "p5e.48xlarge": LinkSpeed(400.0, "EFA 32 × 100 Gbit/s", "AWS EC2 P5: 3200 Gbit/s"),
    "p5en.48xlarge": LinkSpeed(400.0, "EFA 16 × 200 Gbit/s", "AWS EC2 P5: 3200 Gbit/s"),
    "g5.12xlarge": LinkSpeed(5.0, "TCP 40 Gbit/s", "AWS EC2 G5: 40 Gbit/s"),
    "g5.48xlarge": LinkSpeed(12.5, "EFA 100 Gbit/s", "AWS EC2 G5: 100 Gbit/s"),
    "g6.2xlarge": LinkSpeed(1.25, "TCP up to 10 Gbit/s", "AWS EC2 G6: up to 10 Gbit/s"),
    "g6.12xlarge": LinkSpeed(5.0, "TCP 40 Gbit/s", "AWS EC2 G6: 40 Gbit/s"),
    "g6.48xlarge": LinkSpeed(12.5, "EFA 100 Gbit/s", "AWS EC2 G6: 100 Gbit/s"),
}


def expected(scope: str, *, gpu: str | None = None, instance_type: str | None = None
             ) -> LinkSpeed | None:
    """The nominal rate for ``scope`` ("within" a node: by ``gpu``; "between" nodes: by
    ``instance_type``), None when the table does not know it (a CPU node has none)."""
    if scope == "within":
        return WITHIN_NODE.get(gpu or "")
    if scope == "between":
        return BETWEEN_NODES.get(instance_type or "")
    raise ValueError(f"scope: expected 'within' or 'between', got {scope!r}")


__all__ = ["BETWEEN_NODES", "LinkSpeed", "WARN_FRACTION", "WITHIN_NODE", "expected"]

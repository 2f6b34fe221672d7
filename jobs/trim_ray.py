"""Trim Ray to travel to the GPU machine (64 MiB with the tree): `make gpu-wheels` runs it on
the cp312 wheel, tests/test_trimmed_ray.py on the local install.

Ray's wheel is 79 MB; three unstripped ELF files and libraries vlp never imports make most
of it. What goes: `rllib/`, `serve/`, `llm/`, `jars/` (Java workers), the dashboard's built
web client, every `__pycache__/`; the symbol tables of `_raylet.so`, `raylet` and
`gcs_server`. Ray Train, Data, Tune and the core's runtime stay whole.

    python jobs/trim_ray.py --wheel ray-2.60.0-cp312-….whl --out .whl/ray-trimmed.tar.xz
    python jobs/trim_ray.py --site /path/to/site-packages --into /tmp/ray-trimmed
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

DROPPED = ("rllib", "serve", "llm", "jars", "dashboard/client/build")
STRIPPED = ("_raylet.so", "core/src/ray/raylet/raylet", "core/src/ray/gcs/gcs_server")
# what must survive the trimming: the paths vlp's jobs import
KEPT = ("train", "data", "tune", "air", "util", "_private", "dashboard", "autoscaler",
        "runtime_env", "scripts")


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def trim(source: Path, into: Path) -> dict[str, int]:
    """Copy `source`/ray (and Ray's dist-info, for its version) into `into`, leave out DROPPED
    and bytecode, strip the binaries. Returns the sizes, in bytes, before and after."""
    ray_dir = source / "ray"
    if not (ray_dir / "_raylet.so").is_file():
        raise SystemExit(f"trim_ray: {ray_dir} is not a Ray install (no _raylet.so)")
    strip = shutil.which("strip")
    if strip is None:
        raise SystemExit("trim_ray: `strip` (binutils) is not on PATH")
    into.mkdir(parents=True, exist_ok=True)
    skip = {ray_dir / d for d in DROPPED}

    def ignore(folder: str, names: list[str]) -> list[str]:
        return [n for n in names
                if n == "__pycache__" or Path(folder, n) in skip]

    shutil.copytree(ray_dir, into / "ray", ignore=ignore, symlinks=True)
    for info in source.glob("ray-*.dist-info"):
        shutil.copytree(info, into / info.name)
    for part in KEPT:
        if not (into / "ray" / part).exists():
            raise SystemExit(f"trim_ray: ray/{part} is missing after the trimming")
    sizes = {"before_bytes": folder_bytes(ray_dir)}
    for rel in STRIPPED:
        binary = into / "ray" / rel
        if not binary.is_file():
            raise SystemExit(f"trim_ray: {rel} is not in this Ray ({binary})")
        binary.chmod(binary.stat().st_mode | 0o200)  # strip rewrites the file
        subprocess.run([strip, "--strip-unneeded", str(binary)], check=True)
        sizes[f"{Path(rel).name}_bytes"] = binary.stat().st_size
    sizes["after_bytes"] = folder_bytes(into / "ray")
    return sizes


def pack(folder: Path, out: Path) -> int:
    """`folder`'s contents as a .tar.xz at `out`, written beside and renamed when whole."""
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(out.name + ".part")
    with tarfile.open(part, "w:xz", preset=6) as tar:
        for child in sorted(folder.iterdir()):
            tar.add(child, arcname=child.name)
    part.replace(out)
    return out.stat().st_size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--wheel", type=Path, help="a Ray wheel (.whl)")
    source.add_argument("--site", type=Path, help="a site-packages folder holding ray/")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--out", type=Path, help="write the trimmed Ray as this .tar.xz")
    target.add_argument("--into", type=Path, help="write the trimmed Ray into this folder")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="trim-ray-") as tmp:
        site = args.site
        if args.wheel is not None:
            site = Path(tmp) / "wheel"
            with zipfile.ZipFile(args.wheel) as whl:
                whl.extractall(site)
                for entry in whl.infolist():  # extractall drops the mode bits
                    mode = entry.external_attr >> 16
                    if mode & 0o111 and not entry.is_dir():
                        (site / entry.filename).chmod(mode & 0o777)
        into = args.into or Path(tmp) / "trimmed"
        sizes = trim(site, into)
        for key, value in sizes.items():
            print(f"{key}: {value / 1e6:.1f} MB")
        if args.out is not None:
            print(f"packed_bytes: {pack(into, args.out) / 1e6:.1f} MB -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Which images an extraction reads: every image file below a folder (local or by URI), or
the paths listed in a file; each with its canonical image id (the file name's stem, in the
spelling the caption and task importers use, so they bind to the extracted rows)."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path

from vlp.contract.uri_files import UriError, filesystem, is_uri, join, kind
from vlp.datasets.importers.image_ids import canonical_image_id

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")


@dataclass(frozen=True)
class ImageRef:
    image_id: str
    location: str          # local path or URI


def _under_local(folder: Path) -> list[str]:
    return sorted(str(p) for p in folder.rglob("*")
                  if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES
                  and not any(part.startswith(".") for part in p.relative_to(folder).parts))


def _under_uri(uri: str) -> list[str]:
    import pyarrow.fs as pafs

    fs, root = filesystem(uri)
    root = root.rstrip("/")
    found = []
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=True)):
        rel = posixpath.relpath(info.path, root)
        if (info.type == pafs.FileType.File and rel.lower().endswith(IMAGE_SUFFIXES)
                and not any(part.startswith(".") for part in rel.split("/"))):
            found.append(str(join(uri, rel)))
    return sorted(found)


def images_in(folder: str) -> list[str]:
    """Image files below ``folder`` (hidden names skipped), sorted."""
    try:
        what = kind(folder)
    except (UriError, OSError) as e:
        raise ValueError(f"--images {folder}: cannot read it ({str(e).splitlines()[0]})"
                         ) from None
    if what != "dir":
        raise ValueError(f"--images {folder}: no such folder")
    files = _under_uri(str(folder).rstrip("/")) if is_uri(folder) else _under_local(Path(folder))
    if not files:
        raise ValueError(f"--images {folder}: no image files ({', '.join(IMAGE_SUFFIXES)}) in it")
    return files


def images_listed(list_file: str) -> list[str]:
    """Paths or URIs, one a line (blank lines and # comments skipped); a relative path is
    relative to the list file's folder."""
    path = Path(list_file)
    if not path.is_file():
        raise ValueError(f"--image-list {list_file}: no such file")
    base = path.parent
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if not is_uri(line) and not Path(line).is_absolute():
            line = str(base / line)
        if not line.lower().endswith(IMAGE_SUFFIXES):
            raise ValueError(f"--image-list {list_file}: line {n}: {line!r} is not an image "
                             f"file name (expected one of {', '.join(IMAGE_SUFFIXES)})")
        out.append(line)
    if not out:
        raise ValueError(f"--image-list {list_file}: lists no images")
    return out


def image_refs(locations: list[str], where: str) -> list[ImageRef]:
    """One ref per image; two files with one id (``a.jpg`` and ``a.png``) are an error, since
    captions and tasks could not tell them apart."""
    seen: dict[str, str] = {}
    refs = []
    for loc in locations:
        image_id = canonical_image_id(posixpath.basename(loc))
        if image_id in seen:
            raise ValueError(f"{where}: {loc} and {seen[image_id]} have the same image id "
                             f"{image_id!r} (ids come from the file names): rename one")
        seen[image_id] = loc
        refs.append(ImageRef(image_id, loc))
    return refs

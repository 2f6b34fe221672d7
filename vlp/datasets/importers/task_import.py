"""What the task-table importers share: rows that remember their input record, the image-id
check against imported shards, and writing ``tasks/<task>/<split>.parquet`` + manifest."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from vlp.datasets.importers.data_folder import (import_record, require_world, staged_files,
                                                task_path, update_world)
from vlp.datasets.importers.import_error import InputFormatError
from vlp.datasets.importers.registry import ImportReport, Option
from vlp.datasets.storage.shards import list_shards, read_image_shard
from vlp.datasets.storage.task_tables import TASK_SCHEMAS, write_task_table
from vlp.datasets.storage.shard_format import ShardError

IMAGES = Option("--images", "folder of image shards (e.g. OUT/images/coco): every image id of "
                            "the task must be there; an unknown id is an error naming the "
                            "record (default: no check)")
ALLOW_MISSING_IMAGES = Option("--allow-missing-images", "with --images: drop (and count) "
                                                        "records whose image is not there "
                                                        "instead of failing", flag_only=True)
NAME = Option("--name", "file name (without .parquet) of the table in OUT/tasks/TASK/ "
                        "(default: the split, see the format's description)")


@dataclass
class TaskRows:
    """Columns of one task table, plus the input record each row came from."""
    task: str
    columns: dict[str, list] = field(default_factory=dict)
    records: list[tuple[Path, str]] = field(default_factory=list)

    def __post_init__(self):
        self.columns = {name: [] for name in TASK_SCHEMAS[self.task].names}

    def add(self, path: Path, record: str, **values) -> None:
        if set(values) != set(self.columns):
            raise AssertionError(f"{self.task} row needs {sorted(self.columns)}, got "
                                 f"{sorted(values)}")
        for k, v in values.items():
            self.columns[k].append(v)
        self.records.append((path, record))

    def __len__(self) -> int:
        return len(self.records)

    def keep(self, mask: list[bool]) -> None:
        self.columns = {k: [v for v, m in zip(col, mask) if m] for k, col in self.columns.items()}
        self.records = [r for r, m in zip(self.records, mask) if m]


def image_columns(task: str) -> list[str]:
    return [n for n in TASK_SCHEMAS[task].names if n.startswith("image_id")]


def known_image_ids(folder: str | Path) -> set[str]:
    folder = Path(folder)
    files = list_shards(folder)
    if not files:
        raise FileNotFoundError(f"--images {folder} holds no image shards")
    ids: set[str] = set()
    for f in files:
        table, _ = read_image_shard(f, validate=False, columns=["image_id"])
        ids.update(table.column("image_id").to_pylist())
    return ids


def _check_images(rows: TaskRows, known: set[str], folder, allow_missing: bool) -> int:
    cols = image_columns(rows.task)
    ok = [all(rows.columns[c][i] in known for c in cols) for i in range(len(rows))]
    n_bad = ok.count(False)
    if n_bad and not allow_missing:
        i = ok.index(False)
        bad = next(rows.columns[c][i] for c in cols if rows.columns[c][i] not in known)
        path, record = rows.records[i]
        raise InputFormatError(path, f"image {bad!r} is not in the image shards at {folder}; "
                                     f"{n_bad} record(s) refer to unknown images (pass "
                                     f"--allow-missing-images to drop them)", record)
    if n_bad:
        rows.keep(ok)
    return n_bad


def write_tasks(importer: str, tables: dict[str, TaskRows], inputs: list[Path], out: Path, *,
                overwrite: bool, images: str | None, allow_missing_images: bool, options: dict,
                meta: dict | None = None) -> ImportReport:
    """Write ``tables`` (file stem → rows) under ``OUT/tasks/<task>/``, all or nothing."""
    require_world(out)  # fail before any work, not at the manifest update
    if not tables or not any(len(t) for t in tables.values()):
        raise InputFormatError(inputs[0], "holds no records")
    dropped = 0
    if images:
        known = known_image_ids(images)
        for rows in tables.values():
            dropped += _check_images(rows, known, images, allow_missing_images)
    names = sorted(tables)
    targets = [task_path(out, tables[n].task, n) for n in names]
    meta = dict(meta or {})
    if images:
        meta["image_source"] = Path(images).name  # where the ids were checked
    with staged_files(targets, overwrite) as staged:
        for name, tmp in zip(names, staged):
            rows = tables[name]
            if not len(rows):
                raise InputFormatError(inputs[0], f"no records left for table {name!r}")
            extra = {"importer": importer, "inputs": ",".join(p.name for p in inputs),
                     "split": name, **meta}
            try:
                write_task_table(tmp, rows.task, rows.columns, extra_meta=extra)
            except ShardError as e:  # the importer's own checks missed it: name the record
                if e.row is None:
                    raise
                path, record = rows.records[e.row]
                raise InputFormatError(path, e.problem + (f" (field '{e.field}')" if e.field
                                                          else ""), record) from None
    counts = {"rows": sum(len(t) for t in tables.values())}
    if dropped:
        counts["dropped_rows_without_images"] = dropped
    rel = [str(t.relative_to(out)) for t in targets]

    def change(world) -> None:
        for name, path in zip(names, rel):
            task = tables[name].task
            world.tasks.setdefault(task, {})[name] = path
            world.task_rows.setdefault(task, {})[name] = len(tables[name])
    update_world(out, change, log=import_record(importer, inputs, counts, options, rel))
    notes = [f"dropped {dropped} record(s) whose image is not in {images}"] if dropped else []
    return ImportReport(importer, targets, counts, notes)

"""A new store's relations, built once per process and copied.

Creating a store builds every relation over empty raw tables: planning some eighty statements,
about 0.7 s of a 2-core machine's time, the same for every new store of one version of the code
and settings. The first new file store a process creates is built; its checkpointed file is
kept in a folder of the process's own (removed at exit) as the template of that version and
settings, and each later new store of the same copies the file instead. The copy is the same
database as a build would write (the relations' definitions and empty tables, the settings in
``routeaudit_meta``); the store then records its own rebuild time.
"""

from __future__ import annotations

import atexit
import hashlib
import shutil
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path

import duckdb

from audit import _incremental, _relations
from audit.schema import RAW_TABLES, raw_ddl

_lock = threading.Lock()
_templates: dict[str, Path] = {}
_folder: Path | None = None


def key(partitioning: Mapping[str, float] | None) -> str:
    """What an empty store's file depends on: the relations' SQL and how each is stored (table,
    view, view over a default-SLO table), the raw and bookkeeping tables, the partitioning
    given, and DuckDB's version (its file format)."""
    rels = _relations.load_relations()
    cache_empty = 0 >= _relations.CACHE_MIN_SPANS
    h = hashlib.sha256()
    for part in (_relations.relations_version(), duckdb.__version__,
                 *sorted(_relations.views(rels)),
                 "cached:", *(sorted(_relations.cached(rels)) if cache_empty else ()),
                 *(raw_ddl(t) for t in RAW_TABLES), _incremental.DIRTY_DDL,
                 _incremental.RUNS_DUE_DDL,
                 repr(sorted((k, float(v)) for k, v in (partitioning or {}).items()))):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def copy_to(path: Path, template_key: str) -> bool:
    """Copy the template of ``template_key`` to ``path`` (which must not exist); False when this
    process has none yet."""
    with _lock:
        template = _templates.get(template_key)
        if template is None or not template.exists():
            return False
        shutil.copyfile(template, path)
    return True


def keep(path: Path, template_key: str) -> None:
    """Keep a copy of ``path``, a new store just built and checkpointed (nothing left in its
    write-ahead log), as the template of ``template_key``."""
    global _folder
    with _lock:
        if template_key in _templates:
            return
        if _folder is None:
            _folder = Path(tempfile.mkdtemp(prefix="routeaudit-empty-"))
            atexit.register(shutil.rmtree, _folder, True)
        target = _folder / f"{len(_templates)}.duckdb"
        shutil.copyfile(path, target)
        _templates[template_key] = target

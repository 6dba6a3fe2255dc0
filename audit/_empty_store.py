"""A new store's relations, built once per process and copied.

Creating a store builds every relation over empty raw tables: planning some eighty statements,
about 0.7 s of a 2-core machine's time, the same for every new store of one version of the code
and settings. The first time a process creates a new file store of a version and settings, it
builds one in a folder of its own (removed at exit), closes it and keeps it as the template;
every new store of the same copies that file before opening it. The copy is the same database
as a build would write (the relations' definitions and empty tables, the settings in
``routeaudit_meta``); the store then records its own rebuild time.
"""

from __future__ import annotations

import atexit
import hashlib
import shutil
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

import duckdb

from audit import _incremental, _relations, _span_keys
from audit.schema import RAW_TABLES, raw_ddl

_lock = threading.Lock()
_templates: dict[str, Path] = {}
_folder: Path | None = None
_building = threading.local()


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
                 *(raw_ddl(t) for t in RAW_TABLES), _span_keys.SPAN_KEYS_DDL,
                 _incremental.DIRTY_DDL,
                 _incremental.RUNS_DUE_DDL,
                 repr(sorted((k, float(v)) for k, v in (partitioning or {}).items()))):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def copy_to(path: Path, template_key: str, build: Callable[[Path], None]) -> bool:
    """Copy the template of ``template_key`` to ``path``, building the
    template first with ``build`` (a new store at the path given, closed) if this process has
    none yet. The template is built in a file of its own and closed before it is copied: reading
    an open store's file from the process that holds it would release DuckDB's lock on it
    (closing any descriptor of a file drops the process's POSIX locks on that file). False,
    and nothing written, when ``path`` exists by then (another process created it)."""
    global _folder
    with _lock:
        template = _templates.get(template_key)
        if template is None or not template.exists():
            if _folder is None:
                _folder = Path(tempfile.mkdtemp(prefix="routeaudit-empty-"))
                atexit.register(shutil.rmtree, _folder, True)
            template = _folder / f"{template_key[:32]}.duckdb"
            for leftover in (template, template.with_suffix(".duckdb.wal")):
                leftover.unlink(missing_ok=True)  # of a build that failed
            _building.active = True
            try:
                build(template)
            finally:
                _building.active = False
            _templates[template_key] = template
        try:
            with template.open("rb") as src, path.open("xb") as dst:
                shutil.copyfileobj(src, dst)
        except FileExistsError:
            return False
    return True


def building() -> bool:
    """Whether this thread is building a template (whose store must not copy one)."""
    return bool(getattr(_building, "active", False))

"""What the Delta tail source accepts, checked on the driver: replay needs rows that never
disappear, so it tails append-only, unpartitioned tables and nothing else.

* :func:`check_supported` refuses, at construction, a partitioned table, column mapping and
  deletion vectors (:class:`~spark_ckpt.errors.ConfigError` on ``path``).
* :func:`appended_files` gives the data files a commit adds, and refuses a commit that
  removes data files with ``dataChange = true`` (DELETE, UPDATE, MERGE, an overwrite of
  existing data, ...), adds a file with a deletion vector or partition values, or drops or
  retypes a column of the source's schema (:class:`~spark_ckpt.errors.ProtocolError` naming
  the version and its operation). Columns added by schema evolution are fine.
* ``add``/``remove`` actions with ``dataChange = false`` (OPTIMIZE, which rewrites existing
  rows into new files) are ignored: such a commit adds nothing to the channels, whose logs
  go on referencing the original files. Those must therefore stay on disk for as long as any
  replay may need them — do not ``VACUUM`` a tailed table with a retention shorter than the
  checkpoints you may restore.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from deltalake import DeltaTable
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import DeltaError

from spark_ckpt.errors import ConfigError, ProtocolError


def check_supported(table: DeltaTable, uri: str) -> None:
    """:class:`ConfigError` on ``path`` (*uri*) unless *table* is unpartitioned, without
    column mapping and without deletion vectors."""
    metadata = table.metadata()
    if metadata.partition_columns:
        raise ConfigError("path", uri, "an unpartitioned Delta table")
    mode = metadata.configuration.get("delta.columnMapping.mode")
    if mode not in (None, "none"):
        raise ConfigError("path", uri, "a Delta table without column mapping")
    features = table.protocol().reader_features or []
    if "deletionVectors" in features:
        raise ConfigError("path", uri, "a Delta table without deletion vectors")


def appended_files(
    root: str, version: int, actions: list[dict[str, Any]], physical: pa.Schema
) -> list[dict[str, Any]]:
    """The ``add`` actions (``dataChange = true``) of *actions*, the commit of *version* of
    the table at *root*, in commit order; :class:`ProtocolError` if the commit removes data,
    adds a file with a deletion vector or partition values, or changes the schema
    incompatibly with *physical* (the source's physical schema)."""
    operation = "unknown operation"
    added: list[dict[str, Any]] = []
    for action in actions:
        if "commitInfo" in action:
            operation = str(action["commitInfo"].get("operation", operation))
    for action in actions:
        if "remove" in action and action["remove"].get("dataChange", True):
            raise ProtocolError(
                f"version {version} of {root} ({operation}) removes data files: "
                "ckpt-source tails append-only Delta tables"
            )
        if "add" in action and action["add"].get("dataChange", True):
            add = action["add"]
            if add.get("deletionVector"):
                raise ProtocolError(
                    f"version {version} of {root} ({operation}) adds a file with a "
                    "deletion vector: ckpt-source tails append-only Delta tables"
                )
            if add.get("partitionValues"):
                raise ProtocolError(
                    f"version {version} of {root} ({operation}) adds a partitioned "
                    "file: ckpt-source tails unpartitioned Delta tables"
                )
            added.append(add)
        if "metaData" in action:
            _check_schema(root, version, operation, action["metaData"], physical)
    return added


def _check_schema(
    root: str, version: int, operation: str, metadata: dict[str, Any], physical: pa.Schema
) -> None:
    """ProtocolError unless the schema of a ``metaData`` action keeps every column of
    *physical* with the same type (additions are fine) and does not partition the table."""
    try:
        schema = pa.schema(DeltaSchema.from_json(metadata["schemaString"]).to_arrow())
        partitioned = bool(metadata.get("partitionColumns"))
    except (KeyError, TypeError, DeltaError, ValueError, pa.ArrowException) as e:
        raise ProtocolError(
            f"version {version} of {root} ({operation}) has an unreadable schema: {e}"
        ) from e
    for field in physical:
        index = schema.get_field_index(field.name)
        if index < 0 or schema.field(index).type != field.type or partitioned:
            raise ProtocolError(
                f"version {version} of {root} ({operation}) changes column "
                f"{field.name!r} (or partitions the table): ckpt-source needs the columns "
                "it started with"
            )

"""Options of ``source=files``, parsed and validated once into a :class:`FilesSpec`.

==========================  =========================================================
option                      meaning
==========================  =========================================================
``path`` (required)         the directory where the files land: a local path or an
                            object-store URI (``s3://bucket/landing``)
``format`` (required)       ``parquet``, ``json`` (JSON lines) or ``csv``
``schema``                  a DDL string (``"user_id long, amount double"``,
                            :mod:`.ddl_schema`); default: inferred from the first file
``header``                  ``true`` (default): a CSV file's first line names its columns
``channels``                how many channels the files go to, round robin (default 1)
``maxFilesPerTrigger``      at most that many new files per micro-batch (under
                            ``Trigger.AvailableNow``: batches of at most that many)
``cleanSource``             ``off`` (default), ``archive`` or ``delete``: what becomes of
                            a file once a completed checkpoint covers all its rows
``sourceArchiveDir``        where ``cleanSource=archive`` moves files (required then)
``badRecordsPath``          where malformed records are set aside instead of failing
==========================  =========================================================

Parsed wherever the options are given (the user's process, the source runner); keys are
case-insensitive; a bad value is a :class:`~spark_ckpt.errors.ConfigError` naming the option.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import pyarrow as pa

from spark_ckpt.errors import ConfigError
from spark_ckpt.locations.uris import normalized
from spark_ckpt.protocol.option import parse_int
from spark_ckpt.sources.files.ddl_schema import parse_schema

FORMATS: Final = ("parquet", "json", "csv")
CLEAN_SOURCE: Final = ("off", "archive", "delete")
#: Option keys of ``source=files`` (lower-case).
OPTION_KEYS: Final = frozenset(
    {
        "path",
        "format",
        "schema",
        "header",
        "channels",
        "maxfilespertrigger",
        "cleansource",
        "sourcearchivedir",
        "badrecordspath",
    }
)


@dataclass(frozen=True)
class FilesSpec:
    """The options of ``source=files`` (see the module docstring). Picklable."""

    path: str
    format: str
    channels: int = 1
    schema: pa.Schema | None = None
    header: bool = True
    max_files_per_trigger: int | None = None
    clean_source: str = "off"
    archive_dir: str | None = None
    bad_records_path: str | None = None

    @staticmethod
    def from_options(options: Mapping[str, str]) -> FilesSpec:
        """From ``ckpt-source`` options (keys in any case); :class:`ConfigError` naming the
        option."""
        options = {k.strip().lower(): str(v) for k, v in options.items()}
        path = options.get("path", "").strip()
        if not path:
            raise ConfigError("path", None, "the directory where the files land (source=files)")
        fmt = options.get("format", "").strip().lower()
        if fmt not in FORMATS:
            raise ConfigError("format", options.get("format"), " or ".join(FORMATS))
        channels = parse_int("channels", options.get("channels", "1"))
        if channels < 1:
            raise ConfigError("channels", options["channels"], "an integer >= 1")
        limit = options.get("maxfilespertrigger")
        max_files = None if limit is None else parse_int("maxFilesPerTrigger", limit)
        if max_files is not None and max_files < 1:
            raise ConfigError("maxFilesPerTrigger", limit, "a positive integer")
        clean = options.get("cleansource", "off").strip().lower()
        if clean not in CLEAN_SOURCE:
            raise ConfigError("cleanSource", options.get("cleansource"), " or ".join(CLEAN_SOURCE))
        archive = options.get("sourcearchivedir")
        if clean == "archive" and not archive:
            raise ConfigError("sourceArchiveDir", None, "a directory (cleanSource=archive)")
        header = options.get("header", "true").strip().lower()
        if header not in ("true", "false"):
            raise ConfigError("header", options.get("header"), "true or false")
        text = options.get("schema")
        bad = options.get("badrecordspath")
        return FilesSpec(
            path=normalized(path),
            format=fmt,
            channels=channels,
            schema=None if text is None else parse_schema(text),
            header=header == "true",
            max_files_per_trigger=max_files,
            clean_source=clean,
            archive_dir=None if archive is None else normalized(archive),
            bad_records_path=None if bad is None else normalized(bad),
        )

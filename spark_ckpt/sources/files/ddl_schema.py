"""The ``schema`` option of ``source=files``: a Spark DDL string as an Arrow schema.

Runs wherever the options are parsed (the user's process, the source runner); linear in the
length of the string.
"""

from __future__ import annotations

import re
from typing import Final

import pyarrow as pa

from spark_ckpt.errors import ConfigError

#: Spark SQL type names of a DDL schema, as Arrow types.
_TYPES: Final = {
    "string": pa.string(),
    "binary": pa.binary(),
    "boolean": pa.bool_(),
    "tinyint": pa.int8(),
    "byte": pa.int8(),
    "smallint": pa.int16(),
    "short": pa.int16(),
    "int": pa.int32(),
    "integer": pa.int32(),
    "bigint": pa.int64(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
}


def parse_schema(text: str) -> pa.Schema:
    """A DDL schema (``"name type, name type"``, Spark's simple types and
    ``decimal(p, s)``) as an Arrow schema; :class:`ConfigError` on ``schema`` otherwise."""
    fields = []
    for part in re.split(r",(?![^(]*\))", text):
        words = part.strip().split(None, 1)
        if len(words) != 2:
            raise ConfigError("schema", text, "'name type, name type', e.g. 'id long, v string'")
        name, kind = words[0].strip("`"), words[1].strip().lower()
        decimal = re.fullmatch(r"decimal\s*\(\s*(\d+)\s*,\s*(\d+)\s*\)", kind)
        if decimal:
            fields.append(pa.field(name, pa.decimal128(int(decimal[1]), int(decimal[2]))))
        elif kind in _TYPES:
            fields.append(pa.field(name, _TYPES[kind]))
        else:
            raise ConfigError("schema", text, f"a known type for {name!r}: {sorted(_TYPES)}")
    return pa.schema(fields)

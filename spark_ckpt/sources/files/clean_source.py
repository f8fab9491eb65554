"""``cleanSource`` of ``source=files``: archive (into ``sourceArchiveDir``) or delete the files
a completed checkpoint covers, as Spark's option does after a batch commits.

Runs in the source runner, after each completed checkpoint, with its positions. A file is
cleaned only once all its rows lie before them, never before; cleaned files stay in the
listing, and a restore from an older checkpoint that needs one again fails naming it.
Idempotent, and a failure to move or delete is a warning, not an error (see
:func:`clean_covered`). Cost: linear in the listed files, plus one existence check per
covered file.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Sequence

from spark_ckpt.sources.files.file_listing import ListedFile
from spark_ckpt.sources.files.files_options import FilesSpec

log = logging.getLogger(__name__)


def clean_covered(
    spec: FilesSpec, files: Sequence[ListedFile], positions: Sequence[int]
) -> list[str]:
    """Archive or delete (``spec.clean_source``) every one of the listed *files* whose rows all
    lie before *positions* (a completed checkpoint's, per channel). Returns the files cleaned;
    a file already gone is skipped, one that cannot be moved or deleted is logged and tried
    again after the next checkpoint."""
    if spec.clean_source == "off":
        return []
    done = []
    at = [0] * spec.channels
    for f in files:
        at[f.channel] += f.rows
        if at[f.channel] > positions[f.channel]:
            continue
        full = os.path.join(spec.path, f.path)
        if not os.path.exists(full):
            continue
        try:
            if spec.clean_source == "delete":
                os.remove(full)
            else:
                assert spec.archive_dir is not None
                os.makedirs(spec.archive_dir, exist_ok=True)
                shutil.move(full, os.path.join(spec.archive_dir, f.path))
        except OSError as e:  # as Spark's cleanSource: a warning, tried again next time
            log.warning("cleanSource=%s of %s failed: %s", spec.clean_source, full, e)
            continue
        done.append(f.path)
    return done

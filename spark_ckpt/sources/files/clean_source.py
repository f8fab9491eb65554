"""``cleanSource`` of ``source=files``: archive (into ``sourceArchiveDir``) or delete the files
a completed checkpoint covers, as Spark's option does after a batch commits.

Runs in the source runner, after each completed checkpoint, with its positions. A file is
cleaned only once all its rows lie before them, never before; cleaned files stay in the
listing, and a restore from an older checkpoint that needs one again fails naming it.
Idempotent, and a failure to move or delete is a warning, not an error (see
:func:`clean_covered`). Cost: linear in the listed files, plus one scan of the
directory (what is still there: a store's listing grows with the files not cleaned yet,
never with the history).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from spark_ckpt.errors import StoreError
from spark_ckpt.sources.files.file_listing import ListedFile
from spark_ckpt.sources.files.files_options import FilesSpec
from spark_ckpt.sources.files.source_directory import SourceDirectory

log = logging.getLogger(__name__)


def clean_covered(
    spec: FilesSpec,
    directory: SourceDirectory,
    files: Sequence[ListedFile],
    positions: Sequence[int],
) -> list[str]:
    """Archive or delete (``spec.clean_source``) every one of the listed *files* whose rows all
    lie before *positions* (a completed checkpoint's, per channel). Returns the files cleaned;
    a file already gone is skipped, one that cannot be moved or deleted is logged and tried
    again after the next checkpoint. *directory* is the spec's."""
    if spec.clean_source == "off":
        return []
    done = []
    try:
        present = {name for _, name, _ in directory.scan()}
    except StoreError as e:
        log.warning("cleanSource=%s: cannot list %s: %s", spec.clean_source, spec.path, e)
        return []
    at = [0] * spec.channels
    for f in files:
        at[f.channel] += f.rows
        if at[f.channel] > positions[f.channel]:
            continue
        if f.path not in present:
            continue
        try:
            if spec.clean_source == "delete":
                directory.remove(f.path)
            else:
                assert spec.archive_dir is not None
                directory.move_to(f.path, spec.archive_dir)
        except StoreError as e:  # as Spark's cleanSource: a warning, tried again next time
            log.warning("cleanSource=%s of %s failed: %s", spec.clean_source, f.path, e)
            continue
        done.append(f.path)
    return done

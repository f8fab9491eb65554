"""The checkpoint page's overview as one self-contained piece of HTML, for notebooks:
``pipeline.client`` as the last expression of a Jupyter cell (``_repr_html_``), or
``displayHTML(pipeline.client.overview_html())`` on Databricks.

The same documents (:mod:`spark_ckpt.monitoring.documents`) and the same SVG charts
(:mod:`spark_ckpt.monitoring.charts`) as the page, inline: no script, no request back to a
server, so it renders in a notebook's output as it does in a saved copy of the notebook.
"""

from __future__ import annotations

from html import escape
from typing import Any

from spark_ckpt.monitoring import charts, documents
from spark_ckpt.monitoring.root_view import RootView
from spark_ckpt.monitoring.units import size, when

#: How many history entries the overview lists (newest first).
HISTORY_ROWS = 10


def _table(head: list[str], rows: list[list[Any]]) -> str:
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    return f'<table class="spark-ckpt"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def overview_html(view: RootView) -> str:
    """Counts, the latest checkpoints, the newest :data:`HISTORY_ROWS` history entries, the
    last failure's reason and the two charts."""
    doc = documents.checkpoints(view)
    c = doc["counts"]
    state = "running" if view.running else "stopped"
    head = (
        f"<h3>Checkpoints of {escape(view.pipeline)} ({state})</h3>"
        f"<p>{escape(view.root)} · read {when(view.read_ms)}</p>"
    )
    counts = _table(
        ["triggered", "in progress", "completed", "savepoints", "failed", "aborted", "restored"],
        [
            [
                c["total"],
                c["in_progress"],
                c["completed"],
                c["savepoints"],
                c["failed"],
                c["aborted"],
                c["restored"],
            ]
        ],
    )
    latest_rows = []
    for name in ("completed", "savepoint", "failed"):
        e = doc["latest"][name]
        if e is not None:
            latest_rows.append(
                [
                    name,
                    e["id"],
                    when(e.get("failure_timestamp") or e.get("latest_ack_timestamp")),
                    f"{e['end_to_end_duration']} ms",
                    f"{size(e['checkpointed_size'])} / {size(e['state_size'])}",
                    f"{e['failure_reason']}: {e['failure_message']}"
                    if e.get("failure_reason")
                    else "",
                ]
            )
    restored = doc["latest"]["restored"]
    if restored is not None:
        latest_rows.append(
            ["restore", restored["id"], when(restored["restore_timestamp"]), "", "", ""]
        )
    latest = _table(["latest", "id", "when", "duration", "written / full", "note"], latest_rows)
    history = _table(
        ["id", "type", "status", "acked", "triggered", "end to end", "written / full", "alignment"],
        [
            [
                e["id"],
                e["checkpoint_type"].lower(),
                e["outcome"] + (f" ({e['failure_reason']})" if e.get("failure_reason") else ""),
                f"{e['num_acknowledged_subtasks']}/{e['num_subtasks'] or '?'}",
                when(e["trigger_timestamp"]),
                f"{e['end_to_end_duration']} ms",
                f"{size(e.get('checkpointed_size'))} / {size(e.get('state_size'))}",
                f"{e.get('alignment_duration', 0)} ms",
            ]
            for e in doc["history"][:HISTORY_ROWS]
        ],
    )
    now = view.read_ms if view.running else None
    figures = (
        '<div style="display:flex;flex-wrap:wrap;gap:8px">'
        f"{charts.duration_chart(view.records, now)}{charts.size_chart(view.records, now)}</div>"
    )
    style = (
        "<style>table.spark-ckpt{border-collapse:collapse;margin:4px 0}"
        "table.spark-ckpt td,table.spark-ckpt th{border:1px solid #ddd;padding:2px 6px;"
        "text-align:right}</style>"
    )
    return f'<div class="spark-ckpt-overview">{style}{head}{counts}{latest}{figures}{history}</div>'

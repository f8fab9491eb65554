"""The coordinator's side of the wire, with no Spark: the host that runs Flink's checkpoint
coordinator inside ``ckpt-source``'s source runner (its lease, restore point, request handling
and the global committer), and the files under the pipeline root through which every process
of a run talks to it (mailbox, heartbeats, topology, run files, schedule, exported
savepoints).
"""

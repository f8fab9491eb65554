"""Talking to a pipeline by its root, with no Spark: the
:class:`~spark_ckpt.client.pipeline_client.PipelineClient` (requests through the mailbox, queries of
the store and the run files) that the pipeline object, the CLI and any other process use, and the
plot of its checkpoint statistics.
"""

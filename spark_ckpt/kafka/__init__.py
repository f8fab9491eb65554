"""The Kafka adapter of ``source=kafka``: metadata and watermarks (driver side,
:class:`~spark_ckpt.kafka.kafka_client.KafkaMetadata`) and reading an offset range of one partition
(executors, :func:`~spark_ckpt.kafka.kafka_client.read_range`), with ``confluent-kafka``. Kafka's
errors are translated here into :class:`~spark_ckpt.errors.SourceError`."""

"""Testing aids: the deterministic simulation of a job (:mod:`~spark_ckpt.testing.simulation`),
fail points for crash and chaos tests (:mod:`~spark_ckpt.testing.faults`), damaging stored
files (:mod:`~spark_ckpt.testing.damage`), running the demo job in subprocesses
(:mod:`~spark_ckpt.testing.jobs`), and the real services tests run against: a Kafka broker
(:mod:`~spark_ckpt.testing.broker`) and an S3 endpoint (:mod:`~spark_ckpt.testing.s3_endpoint`).
"""

"""Testing aids: the deterministic simulation of a job (:mod:`~spark_ckpt.testing.simulation`),
fail points for crash and chaos tests (:mod:`~spark_ckpt.testing.faults`), damaging stored
files (:mod:`~spark_ckpt.testing.damage`) and running the demo job in subprocesses
(:mod:`~spark_ckpt.testing.jobs`).
"""

"""The executor subtasks' side of the wire: the keyed operators in Spark tasks next to their
state — the subtask function Spark calls per micro-batch, the long-lived subtask host
processes it hands the batches to, the state cache and durable changelog that let a subtask
rebuild anywhere, the asynchronous snapshot thread, the routing of rows to subtasks and the
shipping of the job's code.
"""

"""The CP-SAT planner: the candidate space and the models that search it.

* :mod:`~shardwise.solver.cpsat.candidates` — every way to shard each table, priced per device class (the greedy
  planner and target packing draw from it too).
"""

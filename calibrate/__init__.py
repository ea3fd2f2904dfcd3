"""``shardwise calibrate``: time the executor's kernels, GEMMs, copies and host work on this GPU and fit the profile's
figures to them. It stands above the executor (``shardwise.runtime``, whose kernels and steps it times) and the cost
model (``shardwise.solver.cost_model``, whose formulas the figures are fitted to); nothing imports it.
"""

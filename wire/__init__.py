"""The wire contract: what a job sends and what shardwise answers, as frozen pydantic models.

``spec`` (ModelSpec, FleetSpec, SolveParams, Plan), ``resources`` (the API's stored resources: jobs, stored plans,
pages of lists), ``port_spec`` (the port analysis' request and report), ``executor`` (the figures of shardwise's
executor the cost model prices, its row cache's geometry) and ``units`` (byte and time helpers). It
stands on ``shardwise.hwprofiles`` (a fleet may carry custom accelerator profiles) and imports pydantic and the
standard library only: the client, the CLI, the solver and the service all import it, and the base install needs
nothing else.
"""

"""The planning domain: cost model, candidates, the greedy and CP-SAT planners, bounds, validation, port analysis."""

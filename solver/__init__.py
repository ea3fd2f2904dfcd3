"""The planning domain. Import-light on purpose: the client imports ``solver.spec`` without OR-Tools or numpy."""

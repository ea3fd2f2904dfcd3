"""The service tests' fault drills, installed in the server, worker and solver processes those tests start.

Test support, not product: ``tests/server_support.py`` puts this folder on the ``PYTHONPATH`` of every process it
starts (:func:`server_support.python_path`; the fault tests do the same for the solver processes of a runner in the
test process), and Python's ``site`` imports a ``sitecustomize`` it finds on the path at start-up. Without a drill's
variable this module does nothing and imports nothing.

``SHARDWISE_FAULT_HANG="<model name>:<seconds>"`` makes a job of that model hang that long before solving: it
replaces ``shardwise.service.jobs.before_solve``, the no-op seam the solver process calls before each solve. The
solver honours its time limit, so nothing else overruns it: what runs out is the job's hard limit, and what follows
(the job ended failed, a frozen holder reaped, the worker going on) can be rehearsed. A malformed value is logged
and ignored.
"""

from __future__ import annotations

import os


def _install_fault_hang(spec: str) -> None:
    import logging
    import time

    from shardwise.service import jobs
    from shardwise.wire.spec import ModelSpec

    log = logging.getLogger(jobs.__name__)
    name, _, seconds = spec.rpartition(":")
    try:
        hang_s = float(seconds)
    except ValueError:
        log.warning("SHARDWISE_FAULT_HANG=%r is not <model>:<seconds>: ignored", spec)
        return

    def hang(model: ModelSpec) -> None:
        if model.name == name and 0 < hang_s < 3600:
            log.warning("fault drill: job of %s hangs %.1f s before solving", model.name, hang_s)
            time.sleep(hang_s)

    jobs.before_solve = hang


if spec := os.environ.get("SHARDWISE_FAULT_HANG", ""):
    _install_fault_hang(spec)

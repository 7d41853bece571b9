"""What every scoring worker process does first (the math reward's math-verify workers, reasoning-gym's scorer
workers): standard library only, run in a freshly spawned interpreter by pebble's initializer."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import warnings


def prepare_worker(parent_pid: int, mem_mb: int, name: str) -> None:
    """Exit with the parent, no core files, cap the address space at `mem_mb` MiB (0: none), silence libraries,
    ignore Ctrl-C (the parent handles it), one BLAS / OpenMP thread.

    SIGTERM goes back to its default action: pebble installs a Python handler, which a worker stuck in C never
    runs, so pebble would wait its term_timeout (3 s) before SIGKILL, with its manager thread (every other
    sample's deadline) blocked meanwhile.
    """

    def watch_parent() -> None:  # exit when the parent is gone, even in the middle of a computation
        while True:
            time.sleep(1.0)
            if os.getppid() != parent_pid:
                os._exit(0)

    threading.Thread(target=watch_parent, daemon=True, name=f"{name}-watch-parent").start()
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if mem_mb > 0:
            resource.setrlimit(resource.RLIMIT_AS, (mem_mb << 20, mem_mb << 20))
    except Exception:
        pass
    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = "1"

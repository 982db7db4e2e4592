"""gunicorn settings for the shop: several UvicornWorker processes (the uvicorn-worker
package's; uvicorn's own uvicorn.workers is deprecated), stockade's log records routed to
stderr, and Prometheus metrics that add up over the workers.

    mkdir -p /tmp/shop-metrics
    PROMETHEUS_MULTIPROC_DIR=/tmp/shop-metrics STOCKADE_DSN="host=127.0.0.1 dbname=shop" \\
        gunicorn -c examples/fastapi_shop/gunicorn.conf.py --chdir examples/fastapi_shop app:app

SHOP_BIND (default 127.0.0.1:8000) and SHOP_WORKERS (default 2) override the address and
the number of workers; STOCKADE_LOG_LEVEL (default INFO) the level of the stockade loggers.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

bind = os.environ.get("SHOP_BIND", "127.0.0.1:8000")
workers = int(os.environ.get("SHOP_WORKERS", "2"))
worker_class = "uvicorn_worker.UvicornWorker"
graceful_timeout = 10
control_socket_disable = True  # gunicorn 24+: no control socket in $HOME (older ones ignore it)

# gunicorn configures logging from this dictionary (it replaces gunicorn's own loggers, so
# they are named here too). Without a handler for "stockade", its records would reach the
# root logger, which gunicorn leaves at WARNING with no handler: INFO would appear nowhere.
_LEVEL = os.environ.get("STOCKADE_LOG_LEVEL", "INFO")
logconfig_dict: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s"},
    },
    "handlers": {
        "stderr": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "stream": "ext://sys.stderr",
        },
    },
    "root": {"level": "WARNING", "handlers": ["stderr"]},
    "loggers": {
        "stockade": {"level": _LEVEL, "handlers": ["stderr"], "propagate": False},
        "gunicorn.error": {"level": "INFO", "handlers": ["stderr"], "propagate": False},
        "gunicorn.access": {"level": "WARNING", "handlers": ["stderr"], "propagate": False},
        "uvicorn.error": {"level": "INFO", "handlers": ["stderr"], "propagate": False},
    },
}


def on_starting(server: Any) -> None:
    """Empties the metrics directory: figures of an earlier run must not add up with
    this one's."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        for path in Path(directory).glob("stockade_*.json"):
            path.unlink(missing_ok=True)


def child_exit(server: Any, worker: Any) -> None:
    """Folds a dead worker's counters into the directory's archive (its gauges go)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from stockade.prometheus import mark_process_dead

        mark_process_dead(worker.pid)

"""A kernel on a real Dask ``LocalCluster``: the code to run in it and to end it.

For tests that drive a real kernel of a Jupyter server (``tests/server``, and the sidebar's
browser test): ``setup(root)`` makes a two-node ``LocalCluster`` on 127.0.0.1 in the kernel
(each node its own cache root under ``root``), makes the session's executor a
``DaskExecutor`` on it, declares an env with ``%runtime_env`` (built on both nodes, one
worker started on each) and runs a task on each node; it prints ``nodes: <addresses>``.
``TEARDOWN`` shuts the session, the executor, the client and the cluster down (nothing of it
outlives the kernel's cell).
"""

from __future__ import annotations

SETUP = """
%load_ext jupyter_runtimeenv
import os, time
from distributed import Client, LocalCluster
from jupyter_runtimeenv import api
from jupyter_runtimeenv.dask import DaskExecutor

cluster = LocalCluster(
    n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
    dashboard_address="127.0.0.1:0",
)
client = Client(cluster)
executor = DaskExecutor(client, node_cache_dir={root!r} + "/node-{{name}}")
api.init(executor=executor)
%runtime_env --env-var MODE=cluster --no-widget --no-driver-sys-path

@remote
def where(delay):
    time.sleep(delay)
    return os.getpid()

get([where.remote(1.0), where.remote(1.0)], timeout=120)
print("nodes:", " ".join(sorted(client.scheduler_info()["workers"])))
"""

TEARDOWN = """
api.shutdown()
executor.shutdown()
client.close()
cluster.close()
print("cluster closed")
"""


def setup(root: str) -> str:
    """The setup cell, with each node's cache root below ``root``."""
    return SETUP.format(root=root)

"""Which node a kernel on a Dask cluster goes to (``placement.pick``): plain data, no cluster."""

from __future__ import annotations

from jupyter_runtimeenv.kernels.placement import pick


def load(kernels: int = 0, executing: int = 0, nthreads: int = 1, **more: object) -> dict:
    return {
        "kernels": kernels,
        "executing": executing,
        "nthreads": nthreads,
        "loadavg": 0.1,
        **more,
    }


def test_a_node_with_the_env_ready_wins_over_a_less_loaded_one() -> None:
    loads = {"tcp://a:1": load(kernels=2, ready=True), "tcp://b:1": load()}
    assert pick(loads) == ("tcp://a:1", "its environment is READY there")


def test_among_ready_nodes_and_among_all_the_least_loaded_wins() -> None:
    ready = {"tcp://a:1": load(kernels=1, ready=True), "tcp://b:1": load(ready=True)}
    assert pick(ready)[0] == "tcp://b:1"
    busy = {"tcp://a:1": load(executing=4, nthreads=4), "tcp://b:1": load(executing=2, nthreads=1)}
    assert pick(busy) == ("tcp://a:1", "the least loaded node")  # 1 task per thread < 2
    tie = {"tcp://b:1": load(), "tcp://a:1": load()}
    assert pick(tie)[0] == "tcp://a:1"  # a stable choice


def test_the_kernel_event_schema_registers_and_takes_every_kind() -> None:
    import asyncio
    import logging

    from jupyter_events import EventLogger

    from jupyter_runtimeenv.kernels.cluster import KERNEL_SCHEMA_ID, KernelEvents

    logger = EventLogger()
    got: list[dict[str, object]] = []

    async def listen(logger: object, schema_id: str, data: dict[str, object]) -> None:
        got.append(data)

    async def main() -> None:
        events = KernelEvents(
            "k1", "tcp://s:1", logging.getLogger("test"), logger, asyncio.get_running_loop()
        )
        logger.add_listener(schema_id=KERNEL_SCHEMA_ID, listener=listen)
        events.node = "tcp://n:2"
        events.emit("placed", "placed on Dask worker tcp://n:2 (the least loaded node)")
        events.relay({"kind": "state", "env_id": "e", "state": "BUILDING"})
        events.relay({"kind": "step", "env_id": "e", "step": "pip:x", "status": "running",
                      "label": "pip: alpha==1.0"})  # fmt: skip
        events.relay({"kind": "log", "env_id": "e", "step": "pip:x", "lines": ["a", "b"]})
        events.relay({"kind": "other"})  # dropped
        events.emit("started", "kernel started", pid=12, env_id="e")
        events.emit("exited", pid=12, code=-9)
        events.emit("lost", "kernel k1 is dead: its Dask worker tcp://n:2 left the cluster")
        await asyncio.sleep(0.05)

    asyncio.run(main())
    assert [e["kind"] for e in got] == [
        "placed", "state", "step", "log", "started", "exited", "lost",
    ]  # fmt: skip
    assert all(e["node"] == "tcp://n:2" and e["kernel_id"] == "k1" for e in got)
    assert got[2]["label"] == "pip: alpha==1.0"
    assert got[3]["lines"] == ["a", "b"]

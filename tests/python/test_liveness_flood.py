"""A flood of every peer-monitor listener while a group forms
(docs/design.md, "Failure model": liveness): the attacker reads the
listeners' addresses from the job's store as they are published (as anyone
who can reach the store can) and floods each for 5 s with idle
connections, garbage and connections that close at once, while two ranks
on two pretend hosts form a group and allreduce. The group must form,
every result must match its closed form, and no peer may be taken for dead
or lost (SMDDP_PEER_TIMEOUT=3 s, shorter than the flood). The same, with
the flood started before the connecting rank joins, is
tests/cpp/test_peer_monitor.cc. Traffic goes to 127.0.0.1 only; every
process has a hard deadline and is killed with its children in the end.
"""

import os
import re
import socket
import sys
import threading
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from mp_harness import backend_under_test, find_free_port, worker  # noqa: E402
from server_harness import PY, Procs, env, wait_results  # noqa: E402

pytestmark = pytest.mark.skipif("smddp" not in backend_under_test(),
                                reason="the liveness connections are smddp's")


def test_a_flood_on_every_peer_monitor_listener_while_a_group_forms(tmp_path):
    # Two ranks on two pretend hosts; the attacker reads the liveness
    # listeners' addresses from the job's store as they are published and
    # floods each for 5 s (idle connections, garbage, connections that
    # close at once) while the group forms and allreduces. The group must
    # form, compute every result right and see no peer die.
    port = find_free_port()
    procs = Procs()
    flooded = {"connections": 0, "ports": set()}
    stop = threading.Event()

    def flood():
        import torch.distributed as dist
        from datetime import timedelta

        end = time.monotonic() + 60
        store = None
        while store is None and time.monotonic() < end:
            try:
                store = dist.TCPStore("127.0.0.1", port, is_master=False,
                                      timeout=timedelta(seconds=5))
            except Exception:  # noqa: BLE001  (not up yet)
                time.sleep(0.1)
        held, flood_end = [], None
        while not stop.is_set() and time.monotonic() < end:
            for k in store.list_keys():
                if re.search(r"/liveness/\d+$", k):
                    ip, p, _ = store.get(k).decode().split()
                    if ip.startswith("127.") and p not in flooded["ports"]:
                        flooded["ports"].add(p)
                        flood_end = flood_end or time.monotonic() + 5
            if flood_end and time.monotonic() > flood_end:
                break
            for p in list(flooded["ports"]):
                for i in range(20):
                    c = socket.socket()
                    c.setblocking(False)
                    try:
                        c.connect(("127.0.0.1", int(p)))
                    except BlockingIOError:
                        pass
                    except OSError:
                        c.close()
                        continue
                    flooded["connections"] += 1
                    if i % 3 == 0:
                        try:
                            c.send(b"\x53\x4d\x44\x4cgarbage")
                        except OSError:
                            pass
                    if i % 5 == 0:
                        c.close()
                    else:
                        held.append(c)
                while len(held) > 300:
                    held.pop(0).close()
            time.sleep(0.005)
        for c in held:
            c.close()

    attacker = threading.Thread(target=flood, daemon=True)
    try:
        for r in range(2):
            e = env(RANK=r, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                    SMDDP_HOST_ID=f"flood{r}", FI_TCP_IFACE="lo", SMDDP_PEER_TIMEOUT=3)
            procs.start([PY, worker("server_worker.py"), "steady", str(tmp_path), "8"],
                        env=e, log=os.path.join(tmp_path, f"steady.{r}.log"))
        attacker.start()
        got = wait_results(str(tmp_path), ["steady.0.json", "steady.1.json"], 150)
    finally:
        stop.set()
        attacker.join(timeout=10)
        procs.kill()
    assert len(flooded["ports"]) == 2, flooded
    assert flooded["connections"] > 500, flooded
    for res in got.values():
        assert "crashed" not in res and "init_error" not in res, res
        assert res["calls"] > 0 and res["bad"] == 0, res

"""The parallelism APIs on smddp against Gloo (cases_parallelism.py): a 2x2
DeviceMesh (dp x tp), DTensor redistribution, tensor parallel inside FSDP2
with the same losses and weights as on Gloo, distributed checkpoints that
round-trip bit for bit (save and async_save), a world-4 checkpoint loaded
at world 2, and init_device_mesh's backend_override."""
import math

from mp_harness import run_world


def _close(a, b, rel=1e-5, abs_=1e-6):
    return all(math.isclose(x, y, rel_tol=rel, abs_tol=abs_) for x, y in zip(a, b)) and len(a) == len(b)


def test_tensor_parallel_inside_fsdp2_matches_gloo_and_checkpoints_round_trip(tmp_path):
    runs = {}
    for backend in ("smddp", "gloo"):
        ckpt = tmp_path / backend
        ckpt.mkdir()
        runs[backend] = run_world(4, "cases_parallelism:tp_fsdp", backend=backend, timeout=300,
                                  args=(str(ckpt),))
    for backend, results in runs.items():
        for rank, r in enumerate(results):
            for check in ("redistribute", "redistribute_2d", "dcp_sync", "dcp_async"):
                assert r[check], (backend, rank, check)
    for rank in range(4):
        s, g = runs["smddp"][rank], runs["gloo"][rank]
        assert _close(s["losses"], g["losses"]), (rank, s["losses"], g["losses"])
        for name in g["weights"]:
            assert _close(s["weights"][name], g["weights"][name]), (rank, name)
    # Every rank holds the same full weights.
    assert all(r["weights"] == runs["smddp"][0]["weights"] for r in runs["smddp"])

    # The smddp job's checkpoint, loaded at world 2, gives back its weights.
    ckpt = str(tmp_path / "smddp")
    loaded = run_world(2, "cases_parallelism:load_at_world_2", backend="smddp", timeout=240,
                       args=(ckpt, runs["smddp"][0]["weights"]))
    assert all(r["same"] for r in loaded), loaded


def test_init_device_mesh_backend_override():
    results = run_world(4, "cases_parallelism:backend_override", backend="smddp", timeout=240)
    for rank, r in enumerate(results):
        assert r["dp"]["ok"] and r["tp"]["ok"], (rank, r)
        assert r["tp"]["backend"] == "gloo", (rank, r)
        assert r["dp"]["backend"] == "smddp", (rank, r)

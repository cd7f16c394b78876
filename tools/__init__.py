"""Development tooling that works from a source checkout and is not part of
the installed torch_smddp package (setup.py ships torch_smddp only):

    tools/smddp_cluster.py  a cluster of network namespaces on one machine
                            (scripts/cluster.sh; root), for the cross-host
                            tests and `benchmarks/bench_hosts.py`
    tools/smddp_model/      the alpha-beta performance model, fitted to
                            `bench --save` files: python -m tools.smddp_model

Neither imports torch_smddp or torch.
"""

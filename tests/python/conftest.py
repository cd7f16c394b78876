def pytest_configure(config):
    config.addinivalue_line(
        "markers", "cluster: runs on a scripts/cluster.sh cluster of network namespaces "
        "(root; skipped with the reason where namespaces cannot be made)")

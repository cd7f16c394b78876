"""smdistributed.dataparallel on torch-smddp (see the torch package)."""

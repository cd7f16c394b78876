"""smdistributed.dataparallel.torch on torch-smddp.

`import smdistributed.dataparallel.torch.torch_smddp` then
`torch.distributed.init_process_group(backend="smddp")` is SageMaker's
current way; `smdistributed.dataparallel.torch.distributed` and
`...torch.parallel.distributed.DistributedDataParallel` its older one.

Under Open MPI's mpirun (as SageMaker launches), importing this package maps
OMPI_COMM_WORLD_* onto the c10d variables torch's env:// reads (RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR on one host,
MASTER_PORT), leaving alone any the user set: both ways then work unchanged.
"""
from smdistributed.dataparallel.torch._environment import (apply_mpi_environment,
                                                           warn_about_sagemaker_variables)

warn_about_sagemaker_variables()
# Not strict: across hosts without MASTER_ADDR, init_process_group says what
# is missing (this package's, or torch's naming MASTER_ADDR).
apply_mpi_environment(strict=False)

"""smdistributed.dataparallel.torch on torch-smddp.

`import smdistributed.dataparallel.torch.torch_smddp` then
`torch.distributed.init_process_group(backend="smddp")` is SageMaker's
current way; `smdistributed.dataparallel.torch.distributed` and
`...torch.parallel.distributed.DistributedDataParallel` its older one.
"""
from smdistributed.dataparallel.torch._environment import warn_about_sagemaker_variables

warn_about_sagemaker_variables()

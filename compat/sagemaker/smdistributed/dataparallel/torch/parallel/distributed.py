"""SageMaker's DistributedDataParallel: torch's DDP on the smddp group, with
SageMaker's signature (module, device_ids, output_device,
broadcast_buffers, process_group, bucket_cap_mb) and its no_sync()."""
import torch.distributed as _dist
from torch.nn.parallel import DistributedDataParallel as _TorchDDP

__all__ = ["DistributedDataParallel"]


class DistributedDataParallel(_TorchDDP):
    def __init__(self, module, device_ids=None, output_device=None, broadcast_buffers=True,
                 process_group=None, bucket_cap_mb=None, **unsupported):
        if unsupported:
            raise TypeError("smdistributed.dataparallel's DistributedDataParallel takes module, "
                            "device_ids, output_device, broadcast_buffers, process_group and "
                            f"bucket_cap_mb; {sorted(unsupported)} are torch DDP's only: use "
                            "torch.nn.parallel.DistributedDataParallel for them")
        if process_group is not None and process_group is not _dist.group.WORLD:
            raise ValueError("smdistributed.dataparallel's DistributedDataParallel supports only "
                             "group.WORLD, as SageMaker's does")
        if not _dist.is_initialized():
            raise RuntimeError("smdistributed.dataparallel's DistributedDataParallel needs "
                               "smdistributed.dataparallel.torch.distributed.init_process_group() first")
        # broadcast_buffers is passed only when it is not torch's default:
        # torch 2.13 warns that it is deprecated.
        extra = {} if broadcast_buffers else {"broadcast_buffers": False}
        super().__init__(module, device_ids=device_ids, output_device=output_device,
                         bucket_cap_mb=25 if bucket_cap_mb is None else bucket_cap_mb, **extra)

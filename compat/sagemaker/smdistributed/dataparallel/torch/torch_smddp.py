"""`import smdistributed.dataparallel.torch.torch_smddp`: registers the
"smddp" backend with torch.distributed, as SageMaker's module does."""
import torch_smddp  # noqa: F401 - registers "smddp"

from torch_smddp import *  # noqa: F401,F403

"""What SageMaker's launcher and library read from the environment means
nothing to torch-smddp: say so once, naming what replaces each."""
import os
import warnings

# Variables of SageMaker's library and launcher, and what plays their part here.
_REPLACEMENTS = {
    "SMDATAPARALLEL_": "SMDDP_* variables (docs/configuration.md)",
    "SM_HOSTS": "torchrun's --nnodes/--rdzv-endpoint",
    "SM_CURRENT_HOST": "torchrun's --node-rank, or SMDDP_HOST_ID",
    "SM_NUM_GPUS": "torchrun's --nproc-per-node",
    "SM_DISTRIBUTION_INSTANCE_GROUPS": "torchrun's rendezvous",
}
_warned = False


def sagemaker_variables():
    """(name, replacement) for each SageMaker variable set in this process."""
    found = []
    for name in sorted(os.environ):
        for prefix, replacement in _REPLACEMENTS.items():
            if name == prefix or (prefix.endswith("_") and name.startswith(prefix)):
                found.append((name, replacement))
    return found


def warn_about_sagemaker_variables():
    global _warned
    found = sagemaker_variables()
    if _warned or not found:
        return
    _warned = True
    listed = "; ".join(f"{name} (use {what})" for name, what in found)
    warnings.warn("smdistributed.dataparallel on torch-smddp: these SageMaker variables mean "
                  f"nothing here and are ignored: {listed}", RuntimeWarning, stacklevel=3)

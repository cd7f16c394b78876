"""What SageMaker's launcher and library read from the environment means
nothing to torch-smddp: say so once, naming what replaces each."""
import os
import warnings

# Variables of SageMaker's library and launcher, and what plays their part here.
_REPLACEMENTS = {
    "SMDATAPARALLEL_": "SMDDP_* variables (docs/configuration.md)",
    "SM_HOSTS": "torchrun's --nnodes/--rdzv-endpoint, or mpirun's hosts with MASTER_ADDR",
    "SM_CURRENT_HOST": "torchrun's --node-rank or mpirun's OMPI_COMM_WORLD_*, or SMDDP_HOST_ID",
    "SM_NUM_GPUS": "torchrun's --nproc-per-node, or mpirun's -np",
    "SM_DISTRIBUTION_INSTANCE_GROUPS": "torchrun's rendezvous, or MASTER_ADDR under mpirun",
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


# --------------------------------------------------------------------------
# Open MPI's mpirun, which SageMaker's launcher uses, exports OMPI_COMM_WORLD_*
# where torchrun exports the c10d variables; map one onto the other so that a
# script mpirun started rendezvouses through torch's env://.
# --------------------------------------------------------------------------

# (c10d variable, Open MPI's variable for the same thing)
MPI_VARIABLES = (
    ("RANK", "OMPI_COMM_WORLD_RANK"),
    ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"),
    ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"),
)
_OMPI = dict(MPI_VARIABLES)
# torch's (and torchrun's) default store port; used under mpirun unless MASTER_PORT is set.
DEFAULT_MASTER_PORT = "29500"
# The address every rank can reach rank 0 at, where MASTER_ADDR is not set.
MASTER_ADDR_VARIABLE = "SMDDP_MASTER_ADDR"


def _value(environ, name):
    """environ[name], with an empty value read as unset."""
    value = environ.get(name, "").strip()
    return value or None


def _integer(environ, name):
    value = _value(environ, name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"smdistributed.dataparallel on torch-smddp: {name}={value!r} is not an "
                         "integer") from None


def launched_by_mpirun(environ=None) -> bool:
    """True when Open MPI's mpirun started this process (it exports
    OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE)."""
    environ = os.environ if environ is None else environ
    return (_value(environ, "OMPI_COMM_WORLD_RANK") is not None
            and _value(environ, "OMPI_COMM_WORLD_SIZE") is not None)


def launcher_value(name, environ=None):
    """The launcher's value of a c10d variable (RANK, WORLD_SIZE, LOCAL_RANK,
    LOCAL_WORLD_SIZE) as an int: the variable itself (torchrun's, or the
    user's), else Open MPI's counterpart; None when neither is set."""
    environ = os.environ if environ is None else environ
    if name not in _OMPI:
        raise ValueError(f"launcher_value: {name!r} is not one of {sorted(_OMPI)}")
    value = _integer(environ, name)
    return value if value is not None else _integer(environ, _OMPI[name])


def mpi_environment(environ=None, strict=True) -> dict:
    """The c10d variables to add to environ for a process Open MPI's mpirun
    started: {} when mpirun did not start it. Only variables that are unset
    (or empty) are returned, so whatever the user set wins.

    - RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE: from OMPI_COMM_WORLD_RANK,
      _SIZE, _LOCAL_RANK, _LOCAL_SIZE;
    - MASTER_ADDR: SMDDP_MASTER_ADDR if set; else, when every rank is on one
      host (local size == world size), 127.0.0.1; else an error (strict) or
      nothing (not strict), since no one address is right for every host;
    - MASTER_PORT: DEFAULT_MASTER_PORT (29500, torch's default).
    """
    environ = os.environ if environ is None else environ
    if not launched_by_mpirun(environ):
        return {}
    added = {}
    for name, ompi in MPI_VARIABLES:
        if _value(environ, name) is None and _value(environ, ompi) is not None:
            _integer(environ, ompi)  # an error naming it unless it is an integer
            added[name] = environ[ompi].strip()
    if _value(environ, "MASTER_ADDR") is None:
        world = launcher_value("WORLD_SIZE", environ)
        local = launcher_value("LOCAL_WORLD_SIZE", environ)
        if _value(environ, MASTER_ADDR_VARIABLE) is not None:
            added["MASTER_ADDR"] = environ[MASTER_ADDR_VARIABLE].strip()
        elif local is not None and local == world:
            added["MASTER_ADDR"] = "127.0.0.1"
        elif strict:
            raise RuntimeError(
                "smdistributed.dataparallel on torch-smddp: launched by mpirun across hosts "
                f"({world} ranks, {local if local is not None else 'an unknown number'} on this "
                "host) without MASTER_ADDR: set MASTER_ADDR (or SMDDP_MASTER_ADDR) to an address "
                "of rank 0's host that every host can reach, e.g. `mpirun -x MASTER_ADDR=HOST ...` "
                "(SageMaker's own launcher exports it)")
    if _value(environ, "MASTER_PORT") is None:
        added["MASTER_PORT"] = DEFAULT_MASTER_PORT
    return added


def apply_mpi_environment(environ=None, strict=True) -> dict:
    """Adds mpi_environment(environ, strict) to environ (os.environ by
    default); returns what it added."""
    environ = os.environ if environ is None else environ
    added = mpi_environment(environ, strict)
    environ.update(added)
    return added

"""Reading flight-recorder dumps offline (``python -m torch_smddp.trace analyze DIR``).

When a call fails for good, each rank of the group writes its flight
recorder to ``SMDDP_DEBUG_DIR/smddp_trace_rank<R>_g<group>.json``; a rank
asked for a desync report writes its own too. This module reads a directory
of such dumps and prints, per group, the same desync report a failing call
carries in its error (the text comes from the same C++ code), followed by
each rank's last calls.
"""

from __future__ import annotations

import glob
import json
import os


def load_dumps(directory: str) -> dict:
    """{group: {rank: dump}} from every smddp_trace_rank*.json in ``directory``."""
    groups: dict = {}
    for path in sorted(glob.glob(os.path.join(directory, "smddp_trace_rank*.json"))):
        try:
            with open(path) as f:
                dump = json.load(f)
        except (OSError, ValueError) as e:
            print(f"skipping {path}: {e}")
            continue
        groups.setdefault(dump["group"], {})[int(dump["rank"])] = dump
    return groups


def desync_report(dumps: dict) -> str:
    """The report for one group's dumps ({rank: dump}); a rank with no dump
    is named as one that could not be reached."""
    from . import _C

    size = max(int(d["size"]) for d in dumps.values())
    return _C.desync_report([dumps[r]["position"] if r in dumps else None for r in range(size)])


def _describe(entry: dict) -> str:
    t = entry.get("ended_us") or entry.get("started_us") or entry.get("queued_us") or 0
    extra = f", {entry['path']}" if entry.get("path") else ""
    if entry.get("batch_calls", 0) > 1:
        extra += f", batch from {entry['batch']} of {entry['batch_calls']}"
    err = f": {entry['error']}" if entry.get("error") else ""
    return f"seq {entry['seq']:>6} {entry['call']} [{entry['state']}{extra}] @{t / 1e6:.6f}{err}"


def analyze(directory: str, last: int = 5) -> str:
    groups = load_dumps(directory)
    if not groups:
        return f"no smddp_trace_rank*.json dumps in {directory}"
    out = []
    for name, dumps in sorted(groups.items()):
        size = max(int(d["size"]) for d in dumps.values())
        out.append(f"group '{name}': {size} rank(s), dumps from {len(dumps)}")
        out.append(f"  desync report: {desync_report(dumps)}")
        for r in range(size):
            if r not in dumps:
                out.append(f"  rank {r}: no dump")
                continue
            d = dumps[r]
            out.append(f"  rank {r} (pid {d.get('pid')}): {d.get('reason', '')[:200]}")
            for e in d["entries"][-last:]:
                out.append("    " + _describe(e))
    return "\n".join(out)

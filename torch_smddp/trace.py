"""smddp's offline tools: SMDDP_TIMELINE files (one Chrome/Perfetto
trace-event JSON per rank) and flight-recorder dumps (SMDDP_DEBUG_DIR).

    python -m torch_smddp.trace plot DIR --out step.png [--step -1] [--profile PATTERN]
    python -m torch_smddp.trace analyze DIR [--last 5]
    python -m torch_smddp.trace stragglers DIR [--group NAME]

``analyze`` reads the flight-recorder dumps a failed job left in
``SMDDP_DEBUG_DIR`` and prints, per group, the desync report its error
carried (which rank is behind, on which call) and each rank's last calls
(torch_smddp/flight.py).

``plot`` draws one DDP step across ranks: for every rank, each allreduce
(queued to completed, one colour per bucket), the engine's work (fusion
batches and their shared-memory phases: plan, copy in, combine, copy out) and,
when a torch.profiler trace of that rank is given or found in DIR
(``profile.rank<R>.json``), the backward pass's autograd ops.

``stragglers`` reads the SMDDP_TIMELINE files of a job and ranks who holds
the others back: for every collective that all ranks of a group recorded,
the rank that called it last, and the wait that alone caused (its call
minus the one before the last, the time the others waited for it only).
Call times are the timeline's wall clock: exact between ranks of one host,
as good as the hosts' clock sync across hosts.

Each subcommand lives in its own function; ``main`` only parses arguments.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys

_RANK_FILE = re.compile(r"\.rank(\d+)\.json$")


# ---- reading ---------------------------------------------------------------

def load_timelines(directory: str) -> dict[int, list[dict]]:
    """{rank: events} of the SMDDP_TIMELINE files in ``directory``.

    A timeline file is a JSON array of trace events whose name ends in
    ``.rank<R>.json`` (a torch.profiler export is an object, and is skipped).
    """
    out = {}
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        m = _RANK_FILE.search(path)
        if not m:
            continue
        with open(path) as f:
            data = json.load(f)
        if isinstance(data, list):
            out[int(m.group(1))] = data
    return out


def load_profiles(directory: str, pattern: str | None = None) -> dict[int, list[dict]]:
    """{rank: events} of torch.profiler chrome traces: ``pattern`` with
    ``{rank}``, else ``DIR/*.rank<R>.json`` files that hold an object with
    ``traceEvents`` (what ``prof.export_chrome_trace`` writes)."""
    paths = {}
    if pattern:
        for path in glob.glob(pattern.replace("{rank}", "*")):
            m = re.fullmatch(re.escape(pattern).replace(r"\{rank\}", r"(\d+)"), path)
            if m:
                paths[int(m.group(1))] = path
    else:
        for path in glob.glob(os.path.join(directory, "*.json")):
            m = _RANK_FILE.search(path)
            if m:
                paths[int(m.group(1))] = path
    out = {}
    for rank, path in paths.items():
        with open(path) as f:
            data = json.load(f)
        if isinstance(data, dict) and "traceEvents" in data:
            out[rank] = data["traceEvents"]
    return out


def collective_spans(events: list[dict]) -> list[dict]:
    """The collectives of one timeline: begin args plus ``begin``/``end`` (us)."""
    ends = {e["id"]: e for e in events if e.get("ph") == "e" and e.get("cat") == "collective"}
    out = []
    for e in events:
        if e.get("ph") == "b" and e.get("cat") == "collective" and e["id"] in ends:
            out.append({**e["args"], "begin": e["ts"], "end": ends[e["id"]]["ts"]})
    out.sort(key=lambda s: (s["group"], s["seq"]))
    return out


def _main_group(spans: list[dict]) -> str:
    counts: dict[str, int] = {}
    for s in spans:
        if s["collective"] == "allreduce":
            counts[s["group"]] = counts.get(s["group"], 0) + 1
    return max(counts, key=counts.get) if counts else ""


def find_step(allreduces: list[dict], step: int = -1, calls_per_step: int | None = None):
    """The allreduces of one DDP step. DDP issues the same buckets in the
    same order every step (after the first), so the step length is the
    shortest period of the sequence of call sizes; ``step`` counts steps
    from the end (-1: the last). Without a period, every call."""
    sizes = [s["bytes"] for s in allreduces]
    n = len(sizes)
    p = calls_per_step
    if p is None:
        # The shortest period that holds over the later half of the run at
        # least (and two periods): equal sizes of neighbouring buckets
        # cannot pass for a step.
        for cand in range(1, n // 2 + 1):
            span = max(2 * cand, (n + 1) // 2)
            if all(sizes[i] == sizes[i - cand] for i in range(max(cand, n - span), n)):
                p = cand
                break
    if not p:
        return allreduces
    end = len(allreduces) + (step + 1) * p if step < 0 else (step + 1) * p
    start = max(0, end - p)
    return allreduces[start:end] or allreduces


# ---- plot ------------------------------------------------------------------

def _size(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


_PHASE_COLOURS = {"plan": "#d0d0d0", "copy in": "#4c9f70", "combine": "#d1495b",
                  "copy out": "#6a4c93"}


def _align_profile(prof: list[dict], spans_by_seq: dict[int, dict]) -> float | None:
    """Offset (us) to add to the profiler's timestamps to land on the
    timeline's clock: matched through record_param_comms events, which the
    backend records when it issues a call (their "Seq" is the call's)."""
    offsets = []
    for e in prof:
        if e.get("name") != "record_param_comms" or e.get("ph") != "X":
            continue
        seq = e.get("args", {}).get("Seq")
        if seq is None or int(seq) not in spans_by_seq:
            continue
        offsets.append(spans_by_seq[int(seq)]["begin"] - e["ts"])
    if not offsets:
        return None
    offsets.sort()
    return offsets[len(offsets) // 2]


def _backward_ops(profiles: dict, per_rank: dict, seqs: list, lo: float, hi: float) -> dict:
    """Per rank with a torch.profiler trace: the step's backward ops
    (autograd's evaluate_function spans, as (start, duration) on the
    timeline's clock) from the end of the previous step's last bucket (its
    optimizer step waited for it) to `hi`."""
    backward = {}
    for r, prof in profiles.items():
        if r not in per_rank:
            continue
        by_seq = {s["seq"]: s for s in per_rank[r][2]}
        off = _align_profile(prof, by_seq)
        if off is None:
            continue
        ops = [(e["ts"] + off, e.get("dur", 0)) for e in prof
               if e.get("ph") == "X" and str(e.get("name", "")).startswith(
                   "autograd::engine::evaluate_function")]
        prev = by_seq.get(seqs[0] - 1)
        floor = prev["end"] if prev else lo - (hi - lo)
        ops = [(t, d) for t, d in ops if floor <= t <= hi]
        if ops:
            backward[r] = ops
    return backward


def plot(directory: str, out: str, step: int = -1, profile: str | None = None,
         calls_per_step: int | None = None, title: str | None = None) -> str:
    """Draws one step across ranks into ``out`` (PNG); returns ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    timelines = load_timelines(directory)
    if not timelines:
        raise SystemExit(f"no SMDDP_TIMELINE files (*.rank<R>.json) in {directory}")
    profiles = load_profiles(directory, profile)
    ranks = sorted(timelines)
    per_rank = {}
    for r in ranks:
        spans = collective_spans(timelines[r])
        group = _main_group(spans)
        allreduces = [s for s in spans if s["group"] == group and s["collective"] == "allreduce"]
        per_rank[r] = (spans, group, allreduces)
    # The step is chosen on rank 0 (every rank made the same calls).
    r0 = ranks[0]
    chosen = find_step(per_rank[r0][2], step, calls_per_step)
    seqs = [s["seq"] for s in chosen]
    bucket_of = {seq: i for i, seq in enumerate(seqs)}
    lo = min(s["begin"] for r in ranks for s in per_rank[r][2] if s["seq"] in bucket_of)
    hi = max(s["end"] for r in ranks for s in per_rank[r][2] if s["seq"] in bucket_of)
    pad = max((hi - lo) * 0.05, 50.0)
    lo, hi = lo - pad, hi + pad
    # With a profile, the step's backward starts before its first bucket.
    backward = _backward_ops(profiles, per_rank, seqs, lo, hi)
    lo = min([lo] + [t for ops in backward.values() for t, _ in ops])
    cmap = plt.get_cmap("tab20")
    rows = []  # (label, [(start, width, colour)])
    labels = []  # (row, begin, end, text): bucket sizes on the allreduce bars
    for r in ranks:
        spans, group, allreduces = per_rank[r]
        if r in backward:
            rows.append((f"rank {r} backward", [(t, d, "#9e9e9e") for t, d in backward[r]]))
        calls = [(s["begin"], s["end"] - s["begin"], cmap(bucket_of[s["seq"]] % 20))
                 for s in allreduces if s["seq"] in bucket_of]
        rows.append((f"rank {r} allreduce", calls))
        labels.extend((len(rows) - 1, s["begin"], s["end"], _size(s["bytes"]))
                      for s in allreduces if s["seq"] in bucket_of)
        engine = [(e["ts"], e["dur"], "#34495e") for e in timelines[r]
                  if e.get("ph") == "X" and e["ts"] <= hi and e["ts"] + e["dur"] >= lo
                  and e.get("args", {}).get("group") == group
                  and e.get("cat") in ("batch", "run")]
        rows.append((f"rank {r} engine", engine))
        phases = [(e["ts"], e["dur"], _PHASE_COLOURS.get(e["name"], "k"))
                  for e in timelines[r] if e.get("ph") == "X" and e.get("cat") == "shm"
                  and e.get("args", {}).get("group") == group
                  and lo <= e["ts"] <= hi]
        rows.append((f"rank {r} shm steps", phases))
    fig, ax = plt.subplots(figsize=(11, 0.55 * len(rows) + 1.6))
    for y, (_label, bars) in enumerate(rows):
        for start, width, colour in bars:
            ax.broken_barh([((start - lo) / 1000.0, max(width, 1.0) / 1000.0)],
                           (y - 0.38, 0.76), facecolors=colour, edgecolor="none")
    for y, begin, end, text in labels:
        if (end - begin) / (hi - lo) > 0.06:
            ax.text((begin - lo) / 1000.0 + 0.002 * (hi - lo) / 1000.0, y, text, va="center",
                    ha="left", fontsize=7, color="white", clip_on=True)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([label for label, _ in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, (hi - lo) / 1000.0)
    ax.set_xlabel("ms")
    ax.grid(axis="x", alpha=0.3)
    legend = [Patch(color=c, label=n) for n, c in
              [("fusion batch", "#34495e"), *_PHASE_COLOURS.items()]
              + ([("backward (torch.profiler)", "#9e9e9e")] if backward else [])]
    ax.legend(handles=legend, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=7,
              fontsize=8, frameon=False)
    ax.set_title(title or f"one DDP step on {len(ranks)} rank(s): {len(seqs)} bucket allreduce(s) "
                          "(queued to completed, one colour per bucket)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


# ---- command line ----------------------------------------------------------

def _cmd_plot(args: argparse.Namespace) -> int:
    out = plot(args.dir, args.out, step=args.step, profile=args.profile,
               calls_per_step=args.calls_per_step, title=args.title)
    print(out)
    return 0


def _cmd_analyze(args: argparse.Namespace) -> int:
    from .flight import analyze

    print(analyze(args.dir, last=args.last))
    return 0


# ---- stragglers --------------------------------------------------------------

def stragglers(directory: str, group: str | None = None) -> dict[str, dict]:
    """{group: ranking} from the SMDDP_TIMELINE files in ``directory``.

    A ranking holds ``calls`` (collectives every rank of the group recorded),
    ``ranks`` (the ranks seen) and ``rows``: one per rank, most wait caused
    first, each with ``rank``, ``last`` (calls it was last to make),
    ``share`` (of ``calls``) and ``caused_ms`` (the wait it alone caused:
    per call it was last, its call time minus the one before the last).
    """
    per_rank = {r: collective_spans(ev) for r, ev in load_timelines(directory).items()}
    groups: dict[str, dict[int, dict[int, float]]] = {}
    for rank, spans in per_rank.items():
        for s in spans:
            if group is not None and s["group"] != group:
                continue
            groups.setdefault(s["group"], {}).setdefault(s["seq"], {})[rank] = s["begin"]
    out = {}
    for name, calls in groups.items():
        ranks = sorted({r for by_rank in calls.values() for r in by_rank})
        last = {r: 0 for r in ranks}
        caused = {r: 0.0 for r in ranks}
        n = 0
        for by_rank in calls.values():
            if len(by_rank) != len(ranks) or len(ranks) < 2:
                continue  # not recorded by every rank (a file cut short)
            n += 1
            order = sorted(by_rank.items(), key=lambda kv: kv[1])
            who, when = order[-1]
            last[who] += 1
            caused[who] += (when - order[-2][1]) / 1000.0  # us -> ms
        rows = [{"rank": r, "last": last[r], "share": last[r] / n if n else 0.0,
                 "caused_ms": caused[r]} for r in ranks]
        rows.sort(key=lambda x: (-x["caused_ms"], -x["last"], x["rank"]))
        out[name] = {"calls": n, "ranks": ranks, "rows": rows}
    return out


def format_stragglers(result: dict[str, dict]) -> str:
    lines = []
    for name, g in sorted(result.items()):
        lines.append(f"group {name}: {g['calls']} collective(s) recorded by all "
                     f"{len(g['ranks'])} ranks")
        lines.append(f"  {'rank':>4}  {'last':>6}  {'share':>6}  {'wait caused ms':>14}  "
                     f"{'per call ms':>11}")
        for row in g["rows"]:
            per = row["caused_ms"] / g["calls"] if g["calls"] else 0.0
            lines.append(f"  {row['rank']:>4}  {row['last']:>6}  {row['share']:>6.0%}  "
                         f"{row['caused_ms']:>14.1f}  {per:>11.2f}")
    return "\n".join(lines) if lines else "no collectives in the timeline files"


def _cmd_stragglers(args: argparse.Namespace) -> int:
    result = stragglers(args.dir, group=args.group)
    print(format_stragglers(result))
    return 0 if result else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m torch_smddp.trace",
                                     description="Tools for SMDDP_TIMELINE trace files and "
                                                 "flight-recorder dumps.")
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("analyze", help="desync report and last calls from flight-recorder dumps")
    a.add_argument("dir", help="the SMDDP_DEBUG_DIR of the failed job")
    a.add_argument("--last", type=int, default=5, help="calls to show per rank (default 5)")
    a.set_defaults(func=_cmd_analyze)
    g = sub.add_parser("stragglers", help="which rank holds the others back, from timeline files")
    g.add_argument("dir", help="directory holding the timeline.rank<R>.json files (SMDDP_TIMELINE)")
    g.add_argument("--group", default=None, help="only this group (default: every group)")
    g.set_defaults(func=_cmd_stragglers)
    p = sub.add_parser("plot", help="draw one DDP step across ranks")
    p.add_argument("dir", help="directory holding the timeline.rank<R>.json files")
    p.add_argument("--out", required=True, help="PNG to write")
    p.add_argument("--step", type=int, default=-1,
                   help="which step: negative counts from the end (default -1, the last)")
    p.add_argument("--calls-per-step", type=int, default=None,
                   help="allreduce calls per step (default: the period of the call sizes)")
    p.add_argument("--profile", default=None,
                   help="torch.profiler chrome traces, with {rank} (default: "
                        "DIR/*.rank<R>.json files that are profiler exports)")
    p.add_argument("--title", default=None)
    p.set_defaults(func=_cmd_plot)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

"""The plot of benchmarks/RESULTS.md, "DDP step across hosts": samples/s of
the four DDP variants at three cluster shapes, from the table there (copy
new numbers in when the table changes).

    .venv/bin/python benchmarks/plot_ddp_step_hosts.py   # writes benchmarks/ddp_step_hosts.png
"""
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
shapes = ["2 x 2", "4 x 1", "4 x 2"]
# samples/s from benchmarks/ddp_step.py --paired --compressed (RESULTS.md)
data = {
    "smddp fp32": [5.48, 4.40, 5.34],
    "smddp bf16 crossing": [6.34, 5.37, 5.89],
    "Gloo": [4.59, 4.64, 5.55],
    "Gloo + bf16 hook": [6.01, 6.18, 6.33],
}
x = np.arange(len(shapes))
w = 0.2
fig, ax = plt.subplots(figsize=(7, 4))
for i, (k, v) in enumerate(data.items()):
    ax.bar(x + (i - 1.5) * w, v, w, label=k)
ax.set_xticks(x, [s + " hosts" for s in shapes])
ax.set_ylabel("samples/s (higher is better)")
ax.set_title("DDP step, 20.5M-param transformer, 2 Gbit/s links\n(namespace hosts on one 2-vCPU VM)")
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig("benchmarks/ddp_step_hosts.png", dpi=100)

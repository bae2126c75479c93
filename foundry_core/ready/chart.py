"""The chart of a result: one stacked bar per kind, one colour per phase.

Each segment runs from the median of one phase's time (seconds from exec) to the median of the
next one's. Per start the phases are in order, so their medians are too, and the bar's top is the
median time to the first completion. Each boundary carries a whisker from the fastest to the
slowest start. matplotlib is optional (``pip install foundry-core[bench]``).
"""

from __future__ import annotations

from pathlib import Path

from foundry_core.ready.engines import PHASE_LABELS, PHASES
from foundry_core.ready.stats import spread

COLOURS = ("#9ecae1", "#4292c6", "#fd8d3c", "#74c476", "#807dba")


class MatplotlibMissing(RuntimeError):
    """matplotlib is not installed; the chart is skipped."""


def draw(result: dict, path: Path) -> Path:
    """Draws ``result`` into the PNG ``path``; raises MatplotlibMissing without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MatplotlibMissing("matplotlib is not installed (pip install 'foundry-core[bench]'); "
                                "no chart drawn") from None
    kinds = [k for k in result["kinds"] if result["summary"][k]["phases"]]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(kinds) + 3) + 2.0, 5.5))
    drawn: set[str] = set()
    for x, kind in enumerate(kinds):
        phases = result["summary"][kind]["phases"]
        bottom, top = 0.0, None
        for i, (phase, colour) in enumerate(zip(PHASES, COLOURS)):
            if phase not in phases:
                continue  # its time goes to the next phase found
            s = spread(phases[phase])
            ax.bar(x, s.median - bottom, bottom=bottom, color=colour, edgecolor="white", width=0.6,
                   label=PHASE_LABELS[phase] if phase not in drawn else None)
            drawn.add(phase)
            if s.n > 1:  # staggered, so that the whiskers of close boundaries stay apart
                ax.errorbar(x + 0.12 + 0.035 * i, s.median, yerr=[[s.median - s.min], [s.max - s.median]], fmt="none",
                            ecolor="#333333", elinewidth=0.8, capsize=3)
            bottom, top = s.median, s
        label = f"{top.median:.1f} s" + (f"\n({top.min:.1f}-{top.max:.1f})" if top and top.n > 1 else "")
        ax.annotate(label, (x - 0.1, bottom), textcoords="offset points", xytext=(0, 4), ha="center",
                    fontsize=9)
    ax.set_xticks(range(len(kinds)))
    ax.set_xticklabels([f"{k}\n(n={result['summary'][k]['ok']})" for k in kinds])
    ax.set_ylabel("seconds from exec (median; whiskers: min-max)")
    env = result.get("environment") or {}
    gpu = (env.get("gpu") or {}).get("name") or ""
    version = env.get("engine_version") or ""
    ax.set_title(f"time to ready: {result['engine']} {version} {gpu}".strip())
    handles, labels = ax.get_legend_handles_labels()
    order = [labels.index(PHASE_LABELS[p]) for p in reversed(PHASES) if PHASE_LABELS[p] in labels]
    ax.legend([handles[i] for i in order], [labels[i] for i in order], loc="upper left",
              bbox_to_anchor=(1.01, 1.0), fontsize=8)  # beside the bars: never over a label
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path

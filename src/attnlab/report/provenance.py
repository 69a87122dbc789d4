"""Whether a sweep's runs ran the same code on the same software and hardware: run.json's env compared run by run."""

from __future__ import annotations

from collections import Counter

from attnlab.report.cells import Table
from attnlab.report.load import Run


def facts(run: Run) -> dict[str, str]:
    """{what: value} of a run's provenance: commit, dirty state, jax version and device, those its run.json's env
    records (attnlab.run.record.environment)."""
    env, out = run.env, {}
    git = env.get("git")
    if isinstance(git, dict):
        out["commit"] = git["sha"][:12] if git.get("sha") else f"none ({git.get('note')}, version {git.get('version')})"
        out["dirty"] = str(git.get("dirty")).lower()
    if isinstance(env.get("versions"), dict):
        out["jax"] = str(env["versions"].get("jax"))
    if "backend" in env or "devices" in env:
        devices = env.get("devices") or []
        kinds = sorted({d.split("(")[0].split(":")[0] for d in devices})  # "CpuDevice(id=0)" -> CpuDevice
        out["device"] = f"{env.get('backend')}×{len(devices)}" + (f" ({', '.join(kinds)})" if kinds else "")
    return out


def section(table: Table) -> list[str]:
    """One line when every run agrees; else, per fact that varies, the most common value and the cells whose runs
    differ from it (each such run named by its directory)."""
    runs = [(c, r, f) for c in table.cells for r in c.runs if (f := facts(r))]
    if not runs:
        return []
    keys = list(dict.fromkeys(k for _, _, f in runs for k in f))
    varying = [k for k in keys if len({f.get(k) for _, _, f in runs}) > 1]
    if not varying:
        same = ", ".join(f"{k} {v}" for k, v in runs[0][2].items())
        return [f"Provenance: all {len(runs)} runs agree: {same}."]
    lines = [f"Provenance: the runs differ in {', '.join(varying)}; a difference between cells may be theirs:"]
    for k in varying:
        common, _ = Counter(f.get(k) for _, _, f in runs).most_common(1)[0]
        odd: dict[str, list[str]] = {}
        for c, r, f in runs:
            if f.get(k) != common:
                odd.setdefault(c.label(), []).append(f"{f.get(k)}: {r.path.name}")
        named = "; ".join(f"{label} ({', '.join(items)})" for label, items in odd.items())
        lines.append(f"- {k}: {common} in most runs; differs in {named}")
    return lines

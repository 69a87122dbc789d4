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
        named = kinds and kinds != [env.get("backend")]  # "cpu:0" says no more than the backend
        out["device"] = f"{env.get('backend')}×{len(devices)}" + (f" ({', '.join(kinds)})" if named else "")
    return out


def section(table: Table) -> list[str]:
    """One line when every run agrees; else, per fact that varies, the most common value (the first seen on a tie)
    and the cells whose runs differ from it (a whole cell once, else each such run by its directory)."""
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
        common, count = Counter(f.get(k) for _, _, f in runs).most_common(1)[0]
        named = []
        for cell in table.cells:
            own = [(r, f) for c, r, f in runs if c is cell]
            odd = [(r, f.get(k)) for r, f in own if f.get(k) != common]
            if not odd:
                continue
            values = {v for _, v in odd}
            if len(odd) == len(own) and len(values) == 1:  # the whole cell ran with another value
                named.append(f"{cell.label()} ({values.pop()}: all {len(own)} runs)")
            else:
                named.append(f"{cell.label()} ({', '.join(f'{v}: {run_name(r)}' for r, v in odd)})")
        lines.append(f"- {k}: {common} in {count} of {len(runs)} runs; differs in {'; '.join(named)}")
    return lines


def run_name(run: Run) -> str:
    """A run's directory name; a vmapped seed's with its job's (`3_normalizer=kl/seed1`)."""
    vmapped = (run.path.parent / "seeds.json").exists()
    return f"{run.path.parent.name}/{run.path.name}" if vmapped else run.path.name

"""`attnlab-report SWEEP_DIR`: the command line over attnlab.report."""

from __future__ import annotations

import argparse
import difflib
import math
import sys
from pathlib import Path
from typing import Iterable

import attnlab.report as report
from attnlab import exits
from attnlab.report import central, expected, formation, plots, records, running
from attnlab.report.cells import Table, expand, summarize
from attnlab.report.load import LR, load_runs
from attnlab.report.tables import MAX_COLUMNS
from attnlab.report.write import compose, write_report

DEFAULT_CURVES = ("val/loss", "train/loss")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attnlab-report", description=report.__doc__.splitlines()[0])
    p.add_argument(
        "sweep_dir",
        nargs="?",
        metavar="SWEEP_DIR",
        help=f"a sweep (Hydra multirun) directory, a single run, or a records file (NAME{records.SUFFIX}, --records)",
    )
    p.add_argument("--group-by", nargs="+", metavar="KEY", help="default: the varying config keys except the seed")
    p.add_argument("--metrics", nargs="+", metavar="METRIC", help="default: the test/ metrics")
    p.add_argument(
        "--which", choices=("final", "best"), default="final", help="final parameters, or the best-validation-loss ones"
    )
    p.add_argument(
        "--baseline",
        metavar="KEY=VALUE[,KEY=VALUE]",
        help="paired comparison against this cell, e.g. normalizer=softmax; where that matches several cells and one "
        "of them would be compared with nothing, add the keys that tell them apart, e.g. "
        "normalizer=softmax,model.output_gate=none",
    )
    p.add_argument(
        "--select-lr",
        action="store_true",
        help=f"per group, keep the {LR} with the best mean --select-by metric "
        "(a validation metric, so the test split stays unseen)",
    )
    p.add_argument("--select-by", default="val/loss", metavar="METRIC", help="lr selection metric (default val/loss)")
    p.add_argument(
        "--curves",
        nargs="*",
        metavar="PATTERN",
        help="TensorBoard scalar tags or fnmatch patterns to plot with seed bands, e.g. 'val/*' "
        f"(default: {' '.join(DEFAULT_CURVES)}; none: no plots); one that matches no tag is an error",
    )
    p.add_argument(
        "--log-y",
        nargs="+",
        default=[],
        metavar="PATTERN",
        help="curves whose tag matches one of these fnmatch patterns get a log y axis (geometric mean "
        "and spread), e.g. 'grad_norm/*' 'score_grad/*'",
    )
    p.add_argument(
        "--columns",
        type=int,
        default=MAX_COLUMNS,
        metavar="N",
        help=f"at most N columns per Markdown/LaTeX table; a wider one is split, one table per metric "
        f"group (default {MAX_COLUMNS})",
    )
    p.add_argument(
        "--out", metavar="DIR", help="output directory (default SWEEP_DIR/report; a records file's folder/report)"
    )
    p.add_argument(
        "--verdicts",
        nargs="+",
        metavar="FILE",
        help="instead of a report: one Markdown table of the verdicts of several studies' records files, each with "
        "the options it was packed with: per study and cell, its verdict against its baseline on the headline "
        "metric and the seeds that formed each --formed condition",
    )
    p.add_argument(
        "--records",
        metavar="FILE",
        help=f"also pack the sweep into FILE (NAME{records.SUFFIX}): each run's run.json, metrics.json and "
        "TensorBoard scalars, and this command's report options; attnlab-report FILE OPTIONS reports it as the sweep",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help=f"with a records file NAME{records.SUFFIX}: write nothing, compare the report.md it writes with NAME.md "
        "beside it; exit 0 when they are the same, else print their difference and exit 1",
    )
    p.add_argument(
        "--alpha",
        type=float,
        default=0.05,
        metavar="LEVEL",
        help="family-wise level of the verdict's Holm-corrected tests (default 0.05)",
    )
    p.add_argument(
        "--margin",
        nargs="+",
        default=[],
        metavar="METRIC=VALUE",
        help="the verdict's equivalence margin of a metric (an fnmatch pattern), in the metric's units, e.g. "
        "test/accuracy=0.02 (default: 0.01 for accuracy, ECE, loss, NLL and bits per byte; else 1%% of the "
        "baseline's mean)",
    )
    p.add_argument(
        "--formed",
        nargs="+",
        default=[],
        metavar="CONDITION",
        help=f"what must have formed for the comparisons to be tested: METRIC>=VALUE (or <=, >, <) on each seed's "
        f"value of a metric of metrics.json, e.g. {formation.EXAMPLE}, or of a curve's extreme over training, "
        "max(TAG) or min(TAG) (TAG an fnmatch pattern of logged scalars, e.g. max(attn_max_logit/layer_1/*)>=100); "
        "the verdict opens with the seeds of each cell "
        "that met it, names seeds split across it, and leaves a comparison untested where the baseline did not "
        "form it in every seed",
    )
    p.add_argument(
        "--formed-in",
        choices=formation.SCOPES,
        default="baseline",
        help="whose seeds must all have met --formed for a comparison to be tested: the baseline's (default), or "
        "every compared cell's too",
    )
    p.add_argument(
        "--n-boot", type=int, default=2000, help="bootstrap resamples of each CI (cells, paired Δs, the length table)"
    )
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (every table)")
    return p


def _curves(table: Table, patterns: list[str] | None, log_y: list[str], cache: dict) -> tuple[list[str], list[str]]:
    """The tags to plot and the log-y patterns; ValueError when a given pattern matches no logged tag."""
    if patterns is None:  # the defaults: whichever the runs logged (a note names the others)
        return list(DEFAULT_CURVES), log_y
    if not patterns:
        return [], log_y
    tags = plots.scalar_tags([r for c in table.cells for r in c.runs], cache)
    curves = expand(patterns, tags, "curve pattern")
    expand(log_y, curves, "--log-y pattern")  # one that matches none of the plotted curves is a mistake too
    return curves, log_y


def margins(given: list[str], metrics: list[str]) -> dict[str, float]:
    """--margin METRIC=VALUE pairs as {pattern: margin}; ValueError for a malformed pair, a margin that is not a
    positive number, or a pattern matching none of the report's metrics."""
    out = {}
    for text in given:
        pattern, sep, value = text.partition("=")
        try:
            margin = float(value)
        except ValueError:
            margin = math.nan
        if not sep or not pattern or not margin > 0 or not math.isfinite(margin):
            raise ValueError(
                f"--margin {text!r}; allowed: METRIC=VALUE with VALUE a positive number, e.g. test/accuracy=0.02"
            )
        expand([pattern], metrics, "--margin metric")
        out[pattern] = margin
    return out


def cli(argv: Iterable[str] | None = None) -> int:
    """Run the report; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args = parser.parse_args(argv)
    if (args.sweep_dir is None) == (args.verdicts is None):
        parser.error("give SWEEP_DIR or --verdicts FILE..., not both" if args.verdicts else "SWEEP_DIR is required")
    if args.verdicts:
        return _verdicts(args.verdicts)
    source = Path(args.sweep_dir)
    if records.is_records(source):
        if not source.is_file():
            return _refuse(f"records file {source} does not exist")
        if args.records:
            return _refuse(f"--records packs a sweep directory; {source} is a records file already")
        if args.verify and args.out:
            return _refuse("--verify writes nothing; --out names where a report is written")
        if args.verify and not records.report_beside(source).is_file():
            return _refuse(f"--verify compares with {records.report_beside(source)}, which does not exist")
        print(f"{source}: records packed with the report options: {' '.join(records.command(source)) or 'none'}")
    elif args.verify:
        return _refuse(f"--verify compares a records file's report with the one beside it; {source} is no records file")
    elif not source.is_dir():
        return _refuse(f"sweep directory {source} does not exist")
    out = Path(args.out) if args.out else (source.parent if records.is_records(source) else source) / "report"
    try:
        with records.as_directory(source) as root:
            code = _report(args, root, out)
    except ValueError as exc:  # a records file naming a path outside its sweep
        return _refuse(str(exc))
    if code == exits.COMPLETED and args.records:
        print(f"wrote {records.pack(source, Path(args.records), report_options(argv, args.sweep_dir))}")
    return code


def _verify(markdown: str, committed: Path) -> int:
    """COMPLETED when `committed` holds `markdown`, else its unified difference printed and FAILED."""
    text = committed.read_text()
    if text == markdown:
        print(f"{committed} is the report its records write")
        return exits.COMPLETED
    diff = difflib.unified_diff(
        text.splitlines(), markdown.splitlines(), str(committed), "from its records", lineterm=""
    )
    print("\n".join(diff))
    return exits.FAILED


def _refuse(message: str) -> int:
    print(f"attnlab-report: error: {message}", file=sys.stderr)
    return exits.REFUSED


def report_options(argv: list[str], sweep_dir: str) -> list[str]:
    """The command line less the sweep and the options that name files (--out, --records): what a records file
    keeps to write the same report again."""
    out, skip, found = [], False, False
    for token in argv:
        if skip:  # the value of --out or --records
            skip = False
        elif token == sweep_dir and not found:
            found = True
        elif any(len(name := token.split("=", 1)[0]) > 3 and full.startswith(name) for full in ("--out", "--records")):
            skip = "=" not in token
        else:
            out.append(token)
    return out


def _table(args: argparse.Namespace, root: Path, runs: list) -> tuple[Table, list[str], list[str]]:
    """(the report's table, its curves, their log-y patterns) of `runs`, read from `root`; ValueError on a bad
    option."""
    if not 0 < args.alpha < 1:
        raise ValueError(f"--alpha {args.alpha}; allowed: a level in (0, 1)")
    if args.columns < 1:
        raise ValueError(f"--columns {args.columns}; allowed: an integer >= 1")
    cache: dict = {}  # the curves, the verdict's late crossings and curve conditions read each run's events once
    formed = formation.conditions(args.formed, runs, args.which, cache)
    table = summarize(
        runs,
        args.group_by,
        args.metrics,
        args.which,
        args.baseline,
        args.select_lr,
        args.select_by,
        args.n_boot,
        args.seed,
    )
    table.cache = cache
    curves, log_y = _curves(table, args.curves, args.log_y, table.cache)
    table.progress, table.missing_runs = expected.progress(root, runs)
    table.live = running.section(runs, root)
    table.alpha = args.alpha
    table.margins = margins(args.margin, table.metrics)
    table.formed, table.formed_in = formed, args.formed_in
    return table, curves, log_y


def _report(args: argparse.Namespace, root: Path, out: Path) -> int:
    """The report of the sweep in `root` written to `out`; the exit status."""
    runs = load_runs(root)
    if not runs and expected.sweep_dirs(root):  # a sweep whose jobs have not yet written a record: say so
        print(expected.progress(root, runs)[0])
        print("No run has written its record yet; run attnlab-report again once one has.")
        return exits.COMPLETED
    if not runs:
        return _refuse(f"no runs under {args.sweep_dir} (no metrics.json, run.json or .hydra/ found)")
    try:
        table, curves, log_y = _table(args, root, runs)
    except ValueError as exc:
        return _refuse(str(exc))
    if args.verify:
        return _verify(
            compose(table, curves, table.cache, args.columns).markdown, records.report_beside(args.sweep_dir)
        )
    files = write_report(table, out, curves=curves, log_y=log_y, cache=table.cache, max_columns=args.columns)
    print((out / "report.md").read_text())
    print(f"wrote {', '.join(str(f) for f in files)}")
    return exits.COMPLETED


def _verdicts(files: list[str]) -> int:
    """--verdicts: one table of every study's verdicts, each records file reported with its own options."""
    rows = []
    for name in files:
        file = Path(name)
        if not (records.is_records(file) and file.is_file()):
            return _refuse(f"--verdicts {file}: no records file (NAME{records.SUFFIX})")
        args = _parser().parse_args([name, *records.command(file)])
        with records.as_directory(file) as root:
            try:
                table = _table(args, root, load_runs(root))[0]
            except ValueError as exc:
                return _refuse(f"{file}: {exc}")
            rows += central.rows(name.removesuffix(records.SUFFIX), table)
    print("\n".join(central.markdown(rows)))
    return exits.COMPLETED


def main(argv: Iterable[str] | None = None) -> None:
    """Console script `attnlab-report`: exits non-zero on an error."""
    code = cli(argv)
    if code:
        sys.exit(code)


if __name__ == "__main__":
    main()

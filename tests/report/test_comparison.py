"""The report opens with the comparison: title, Δ to the baseline with interval, n and p, best first, chance."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from attnlab.report import Run, summarize
from attnlab.report.write import to_markdown

BASE = {"baseline/accuracy": 0.125}


def runs(normalizer, accs, eces=None, nll_is_loss=True):
    eces = eces or [0.05] * len(accs)
    out = []
    for s, (a, e) in enumerate(zip(accs, eces)):
        final = {"test/accuracy": a, "test/ece": e, "test/loss": 2 - a, "test/nll": 2 - a if nll_is_loss else 1.0}
        out.append(
            Run(
                Path(f"{normalizer}{s}"),
                "completed",
                {"normalizer": normalizer, "seed": s, "task": "mqar"},
                final,
                baseline=BASE,
                headline="test/accuracy",
                baseline_labels={"test/accuracy": {"baseline/accuracy": "chance"}},
            )
        )
    return out


SOFTMAX, KL, LINEAR = [0.50, 0.55, 0.60, 0.52], [0.62, 0.60, 0.71, 0.66], [0.40, 0.56, 0.45, 0.50]


def test_the_first_line_names_the_comparison_and_the_best_comes_first():
    table = summarize(runs("softmax", SOFTMAX) + runs("kl", KL) + runs("linear", LINEAR), baseline="normalizer=softmax")
    md = to_markdown(table).splitlines()
    assert md[0] == "# normalizer=kl, normalizer=linear against normalizer=softmax (final parameters)"
    acc = md.index("- **test/accuracy** (higher is better; task baselines: chance 0.125)")
    ranked = md[acc + 1 : acc + 4]
    assert [line.split(":")[0].strip() for line in ranked] == [
        "1. normalizer=kl",
        "2. normalizer=softmax",
        "3. normalizer=linear",
    ]
    d = np.subtract(KL, SOFTMAX)  # the paired Δ, its Student-t interval (4 pairs) and ttest_rel's p, independently
    lo, hi = stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
    p = stats.ttest_rel(KL, SOFTMAX).pvalue
    assert ranked[0] == (
        f"  1. normalizer=kl: Δ {d.mean():+.3g} [{lo:+.3g}, {hi:+.3g}], n=4 pairs, p={p:.3g}; "
        f"{np.mean(KL):.3g} [{table.cells[0].stats['test/accuracy'].ci_low:.3g}, "
        f"{table.cells[0].stats['test/accuracy'].ci_high:.3g}] (n=4)"
    )
    loss = md.index("- **test/loss** (lower is better)")
    assert md[loss + 1].startswith("  1. normalizer=kl: Δ -")  # lower loss first


def test_intervals_stay_in_the_metric_range_and_the_duplicate_nll_is_dropped():
    eces = [0.001, 0.002, 0.05]  # a t interval of the mean goes below 0
    table = summarize(runs("softmax", SOFTMAX[:3], eces) + runs("kl", KL[:3], eces))
    assert "test/nll" not in table.metrics and {"test/accuracy", "test/ece", "test/loss"} <= set(table.metrics)
    s = table.cells[0].stats["test/ece"]
    raw = stats.t.interval(0.95, 2, loc=np.mean(eces), scale=stats.sem(eces))
    assert raw[0] < 0 and s.ci_low == 0.0 and s.ci_high == pytest.approx(raw[1], rel=1e-12)
    for line in to_markdown(table).splitlines():  # 3 significant figures in every number of the opening
        for number in re.findall(r"\d+\.\d+(?:e-?\d+)?", line.split("(n=")[0]):
            digits = number.split("e")[0].replace(".", "").lstrip("0")
            assert len(digits) <= 3, (number, line)
    distinct = summarize(runs("softmax", SOFTMAX[:3], nll_is_loss=False))
    assert "test/nll" in distinct.metrics  # kept where it is not the loss (scores_mse, mse heads)


def test_baselines_that_differ_by_cell_are_each_named_beside_their_cell():
    """Cells whose tasks differ (lm's bytes and a BPE) keep their own baselines and names; cells that agree, one."""

    def lm(tokenizer, unigram, bits, extra=None):
        labels = {"test/bits_per_byte": {"baseline/bits_per_byte": "unigram", **(extra or {})}}
        return [
            Run(
                Path(f"{tokenizer}{s}"),
                "completed",
                {"task.tokenizer": tokenizer, "seed": s, "task": "lm"},
                {"test/bits_per_byte": b},
                baseline={"baseline/bits_per_byte": unigram + 0.001 * s, **({k: 3.53 for k in extra or {}})},
                headline="test/bits_per_byte",
                baseline_labels=labels,
            )
            for s, b in enumerate(bits)
        ]

    bigram = {"baseline/bits_per_byte_bigram": "bigram"}
    table = summarize(lm("bytes", 4.71, [2.1, 2.12], bigram) + lm("bpe", 2.51, [1.56, 1.55]))
    line = next(x for x in to_markdown(table).splitlines() if x.startswith("- **test/bits_per_byte**"))
    assert "task baselines: unigram 2.51 (task.tokenizer=bpe), unigram 4.71 (task.tokenizer=bytes), " in line
    assert line.endswith("bigram 3.53 (task.tokenizer=bytes))")  # the BPE's runs declare no bigram rate
    same = summarize(lm("bytes", 4.71, [2.1, 2.12]) + lm("bytes2", 4.71, [2.0, 2.2]))
    line = next(x for x in to_markdown(same).splitlines() if x.startswith("- **test/bits_per_byte**"))
    assert line.endswith("task baselines: unigram 4.71)")

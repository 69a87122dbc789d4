"""The lm task's baselines in bits per byte, as a Markdown table, from the runs of a sweep.

Every completed run's metrics.json carries the task's test-split baselines (`baseline/...`): the training text's
unigram entropy (`bits_per_byte`), its bigram conditional entropy (`bits_per_byte_bigram`) and majority-byte
accuracy. They depend on the corpus and its split only, so every run must carry the same values; a sweep whose
runs disagree (two corpora or splits mixed) is an error, not an average.

Usage: python baselines.py SWEEP_DIR > baselines.md
"""

import json
import sys
from pathlib import Path

ROWS = [
    ("baseline/bits_per_byte", "unigram entropy of the training text (bits per byte)"),
    ("baseline/bits_per_byte_bigram", "bigram conditional entropy H(X_t ∣ X_t−1) (bits per byte)"),
    ("baseline/accuracy", "majority-byte accuracy on test"),
]


def baselines(sweep: Path) -> tuple[dict[str, float], int]:
    """The baselines shared by every completed run under `sweep`, and how many runs carried them."""
    seen, n = None, 0
    for path in sorted(sweep.rglob("metrics.json")):
        record = json.loads(path.read_text())
        if record.get("status") != "completed":
            continue
        base = {k: record.get("baseline", {}).get(k) for k, _ in ROWS}
        if seen is not None and base != seen:
            raise SystemExit(
                f"baselines.py: error: {path} has baselines {base}, other runs {seen}; one corpus and split per sweep"
            )
        seen, n = base, n + 1
    if seen is None:
        raise SystemExit(f"baselines.py: error: no completed run under {sweep}")
    return seen, n


def main(argv=None) -> None:
    sweep = Path((argv or sys.argv[1:])[0])
    values, n = baselines(sweep)
    print(f"Baselines of the lm task (test split; identical in all {n} completed runs):\n")
    print("| baseline | value |\n|---|---:|")
    for key, label in ROWS:
        v = values[key]
        print(f"| {label} | {'—' if v is None else f'{v:.4f}'} |")


if __name__ == "__main__":
    main()

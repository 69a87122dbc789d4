"""TensorBoard HParams as a sweep: one experiment config (swept keys marked `differs`), one session per run.

TensorBoard's hparams plugin takes the experiment config of an arbitrary run, so every run of a sweep
writes the same one, computed from the values the sweep takes (the caller reads them from the sweep's
multirun.yaml: sweep.definition.sweep_values). The server lists hparams `differs` first, then by name, and the
HParams tab ticks the first five, so `differs` marks the swept keys, then the top-level choices (normalizer,
task, head, model) up to five in all; every other option is unticked.

Domains never hide a run of another sweep opened in the same TensorBoard (the HParams tab's value
filters start from the domain): config-group choices list every choice in configs/, booleans both
values, numbers an interval, other strings (seed included) no domain.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

from tensorboard.compat.proto import summary_pb2
from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

TOP_LEVEL = ("normalizer", "task", "head", "model")  # in the order they fill the ticked columns
SHOWN = 5  # the HParams tab ticks the first five hparams (differs first, then by name)
# Declared metrics, in this order, where the run logged them (lm tasks: bits_per_byte, perplexity; subword tokens also
# bits_per_token).
METRICS = (
    "test/accuracy",
    "val/accuracy",
    "test/loss",
    "val/loss",
    "test/bits_per_byte",
    "test/bits_per_token",
    "test/perplexity",
    "test/ece",
    "test/mse",
    "test/r2",
    "train/nonfinite_steps",
)
# Hydra keys whose hparam has another name (the accelerator choice would otherwise sort first).
ALIASES = {"accelerator": "trainer.accelerator"}
CHOICE_GROUPS = {
    "normalizer": "normalizer",
    "task": "task",
    "head": "head",
    "model": "model",
    "trainer.accelerator": "accelerator",
}


def _typed(value: str, like: Any) -> Any:
    """A swept value as written on the command line, converted to the type of this run's own value."""
    if isinstance(like, bool):
        return value.lower() == "true"
    if isinstance(like, (int, float)):
        try:
            return float(value)
        except ValueError:
            return value
    return value


Column = tuple[list, bool, list]  # (the values it takes across the sweep, differs, a choice group's every choice)


def declare(
    own: Mapping[str, Any],
    swept: Mapping[str, list[str]],
    seeds: list[int],
    catalogue: Mapping[str, Mapping[str, Mapping[str, Any]]],
) -> dict[str, Column]:
    """{hparam: (the values it takes across the sweep, differs, domain)}: this run's, swept values, other choices'
    options.

    `swept` is {key: the values the sweep gives it, as written on the command line} under Hydra's names (the
    caller's: sweep.definition.sweep_values); a key ALIASES renames gets its hparam name here. `seeds` are this
    job's vmapped seeds; each swept seed s contributes s..s+len(seeds)-1. Outside a sweep nothing is swept, so the
    top-level choices are marked instead: runs gathered under outputs/ then open on them. `catalogue` is the config
    layer's {group: {choice: its YAML's scalar options}}, the options given for the swept choices at least
    (config.registry.catalogue): a choice group's column lists every choice, a swept group's options are columns.
    """
    swept = {ALIASES.get(k, k): v for k, v in swept.items()}
    values: dict[str, list] = {k: [v] for k, v in own.items()}
    for key, vals in swept.items():
        if key == "seed":
            vals = [str(int(s) + i) for s in vals for i in range(len(seeds))]
        typed = [_typed(v, own.get(key, v)) for v in vals]
        values.setdefault(key, []).extend(typed)
        if key in catalogue:  # a swept config group: every choice's options are columns
            for choice in vals:
                for k, v in catalogue[key].get(choice, {}).items():
                    values.setdefault(f"{key}.{k}", []).append(v)
    values["seed"] = sorted({*values.get("seed", []), *map(str, seeds)}, key=int)
    # Only what the sweep varies on purpose and the top-level choices are marked: an option that differs
    # only as a consequence of a swept choice (normalizer.prior in a kl/softmax sweep) stays unticked.
    marked = [k for k in swept if k in values] + (["seed"] if len(seeds) > 1 and "seed" not in swept else [])
    marked += [k for k in TOP_LEVEL if k in values and k not in marked][: max(0, SHOWN - len(marked))]
    domains = {name: sorted(catalogue.get(group, {})) for name, group in CHOICE_GROUPS.items()}
    return {key: (list(dict.fromkeys(vals)), key in marked, domains.get(key, [])) for key, vals in values.items()}


def metric_list(declared: Mapping[str, Column], logged) -> list[str]:
    """The declared metrics: those this run logged, or all of METRICS where the sweep spans tasks or heads
    (every run must declare the same list, and a metric a run lacks is only an empty cell)."""
    spans = any(len(declared.get(k, ([], False, []))[0]) > 1 for k in ("task", "head"))
    return [m for m in METRICS if spans or m in logged]


def _kind(vals) -> int:
    """One TensorBoard type per column: bool, float64 if every value is a number, else string."""
    if all(isinstance(v, bool) for v in vals):
        return api_pb2.DATA_TYPE_BOOL
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
        return api_pb2.DATA_TYPE_FLOAT64
    return api_pb2.DATA_TYPE_STRING


def _as(kind: int, v: Any):
    return {api_pb2.DATA_TYPE_BOOL: bool, api_pb2.DATA_TYPE_FLOAT64: float}.get(kind, str)(v)


def _order(names) -> list[str]:
    return sorted(names, key=lambda k: (k not in TOP_LEVEL, k))


def experiment_summary(declared: Mapping[str, Column], metrics: list[str]) -> summary_pb2.Summary:
    """The experiment config: hparams with domains and differs flags, then the metric list."""
    infos = []
    for name in _order(declared):
        vals, differs, choices = declared[name]
        kind = _kind(vals)
        info = api_pb2.HParamInfo(name=name, differs=differs, type=kind)
        if name in CHOICE_GROUPS:
            info.domain_discrete.extend(sorted({*map(str, vals), *choices}))
        elif kind == api_pb2.DATA_TYPE_BOOL:
            info.domain_discrete.extend([False, True])
        elif kind == api_pb2.DATA_TYPE_FLOAT64:
            info.domain_interval.min_value, info.domain_interval.max_value = min(vals), max(vals)
        infos.append(info)
    metric_infos = [
        api_pb2.MetricInfo(
            name=api_pb2.MetricName(tag=m),
            display_name=m,
            dataset_type=(
                api_pb2.DATASET_VALIDATION
                if m.startswith("val/")
                else api_pb2.DATASET_TRAINING
                if m.startswith("train/")
                else api_pb2.DATASET_UNKNOWN
            ),
        )
        for m in metrics
    ]
    experiment = api_pb2.Experiment(hparam_infos=infos, metric_infos=metric_infos)
    return _summary(metadata.EXPERIMENT_TAG, plugin_data_pb2.HParamsPluginData(experiment=experiment))


def session_start_summary(own: Mapping[str, Any], declared: Mapping[str, Column]) -> summary_pb2.Summary:
    """This run's hparams; an option of another swept choice (not this run's) is left out: an empty cell."""
    start = plugin_data_pb2.SessionStartInfo(start_time_secs=time.time())
    for name in _order(own):
        v = _as(_kind(declared[name][0]) if name in declared else _kind([own[name]]), own[name])
        field = {bool: "bool_value", float: "number_value", str: "string_value"}[type(v)]
        setattr(start.hparams[name], field, v)
    return _summary(metadata.SESSION_START_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_start_info=start))


def session_end_summary(status: str) -> summary_pb2.Summary:
    code = api_pb2.STATUS_SUCCESS if status == "completed" else api_pb2.STATUS_FAILURE
    end = plugin_data_pb2.SessionEndInfo(status=code, end_time_secs=time.time())
    return _summary(metadata.SESSION_END_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_end_info=end))


def _summary(tag: str, data: plugin_data_pb2.HParamsPluginData) -> summary_pb2.Summary:
    value = summary_pb2.Summary.Value(tag=tag, metadata=metadata.create_summary_metadata(data))
    return summary_pb2.Summary(value=[value])

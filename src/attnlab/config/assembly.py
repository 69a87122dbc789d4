"""A run assembled from its composed config, in one order: every check the config alone answers (the unknown keys, each
group's declared values, the seeds), then the machine (threads, platform, devices, compile cache), the checks that
need it (seeds × devices × batch), the normalizers of every layer, the task (its data) and the checks that need it
(its head, its lengths, causality), and last the model and optimizer.
"""

from __future__ import annotations

import json

from omegaconf import DictConfig, OmegaConf

from attnlab import checks
from attnlab.config import composition, construct, registry

# Switches that default to null: on under a task that exists to measure attention sinks (Task.measures_sinks).
SINK_SWITCHES = {"trainer": "final_stats", "model": "extreme_token_stats"}


def sink_statistics(task_class, nodes: dict[str, dict]) -> dict[str, dict]:
    """The trainer and model nodes with each switch of SINK_SWITCHES left null set to whether the task exists to
    measure attention sinks (Task.measures_sinks); a switch given true or false stays."""
    on = bool(getattr(task_class, "measures_sinks", False))
    return {
        group: {**nodes[group], key: on if nodes[group].get(key) is None else nodes[group][key]}
        for group, key in SINK_SWITCHES.items()
    }


def program_key(cfg: DictConfig) -> str:
    """The composed config less the options its optimizer injects as values (Optimizer.injected): two runs of one
    process with equal keys compile the same programs (attnlab.train.programs), whatever their learning rates."""
    # A config composed with its Hydra node (attnlab-check, the fuzzer) keeps it; the run's own config has none.
    resolved = OmegaConf.to_container(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]), resolve=True)
    injected = construct.build("optim", resolved["optim"]).injected()
    resolved["optim"] = {k: v for k, v in resolved["optim"].items() if k not in injected}
    return json.dumps(resolved, sort_keys=True, default=repr)


def check(cfg: DictConfig) -> None:
    """Everything the config alone answers, before anything is built or the machine configured: unknown keys, then
    each group's declared values, compile_cache and the seed range (composition.refuse_bad_values); each group's
    undeclared values are checked by construct.build and its component when `assemble` builds it."""
    composition.no_unknown_keys(cfg)
    composition.refuse_bad_values(cfg)


def check_devices(cfg: DictConfig, device_count: int) -> None:
    """What the config and the machine answer together: the batch, or the vmapped seeds, split over the devices."""
    from attnlab.accelerator import seeds_over_devices

    t = cfg.trainer
    checks.require(
        seeds_over_devices(t.vmap_seeds, device_count) or t.batch_size % device_count == 0,
        f"trainer.batch_size={t.batch_size} is not divisible by the device count ({device_count}), "
        f"nor is trainer.vmap_seeds={t.vmap_seeds}",
    )


def configure_machine(cfg: DictConfig, launcher: dict):
    """The accelerator group built and applied before JAX starts: CPU threads per parallel job of the `launcher`
    (Hydra's launcher node), platform, devices, GPU memory fraction, distributed, compile cache. Returns it."""
    from attnlab.accelerator import configure, limit_threads

    limit_threads(str(launcher.get("_target_", "")), launcher.get("n_jobs"))
    accelerator = construct.build("accelerator", OmegaConf.to_container(cfg.accelerator, resolve=True))
    configure(
        accelerator.platform,
        accelerator.devices,
        cfg.compile_cache,
        accelerator.gpu_memory_fraction,
        accelerator.distributed,
    )
    return accelerator


def build_run(cfg: DictConfig, choices: dict, launcher: dict):
    """A command's run: `check`, then `configure_machine`, then `assemble`'s objects and the matmul precision.
    Returns (task, nets, tx, loop, matmul precision); ConfigError on bad input."""
    from attnlab.accelerator import apply_matmul_precision

    check(cfg)
    accelerator = configure_machine(cfg, launcher)
    task, nets, tx, loop = _assemble_checked(
        cfg, accelerator, choices.get("head"), choices.get("normalizer"), choices.get("task")
    )
    return task, nets, tx, loop, apply_matmul_precision(accelerator.matmul_precision, nets[0].body.dtype)


def layer_normalizer_makers(cfg: DictConfig, selected: str | None = None) -> list:
    """One normalizer factory per entry of model.layer_normalizers (cycled over the layers by the model).

    null: every layer uses `normalizer`. A listed name equal to the selected `normalizer` uses its
    composed config (with the normalizer.<option>= overrides); any other name its YAML defaults.
    """
    from attnlab.normalizers import FROM_ATTENTION

    node = OmegaConf.to_container(cfg.normalizer, resolve=True)
    names = OmegaConf.to_container(cfg.model, resolve=True).get("layer_normalizers")
    if names is None:
        return [construct.build("normalizer", node, deferred=FROM_ATTENTION, choice=selected)]
    composition.check_layer_normalizers(names)
    if selected is None:  # outside Hydra: the YAML whose _target_ the composed normalizer has
        selected = registry.name_of("normalizer", registry.resolve_target(node.get("_target_"), "normalizer"))
    return [
        construct.build(
            "normalizer", node if n == selected else registry.load("normalizer", n), deferred=FROM_ATTENTION, choice=n
        )
        for n in names
    ]


def _causal(model: dict, granularity: str, makers: list, task_label: str) -> bool:
    """model.causal resolved against the task's granularity; a ConfigError where the two or a causal-only
    normalizer disagree."""
    causal = granularity == "token" if model.get("causal") is None else bool(model["causal"])
    checks.require(
        not (granularity == "token" and not causal),
        "model.causal=false with a per-token task lets each position see its own target; "
        "use model.causal=true or model.causal=null",
    )
    causal_only = sorted(
        {construct.built_name(m) for m in makers if getattr(construct.built_class(m), "causal_only", False)}
    )
    setting = "null" if model.get("causal") is None else str(model["causal"]).lower()
    checks.require(
        causal or not causal_only,
        f"normalizer={','.join(causal_only)} needs causal attention, but {task_label} is a "
        f"per-{granularity} task, bidirectional with model.causal={setting}; allowed: a per-token task "
        f"(e.g. task=mqar, task=lm) with model.causal=null or true",
    )
    return causal


def assemble(cfg: DictConfig, head_name: str | None, normalizer_name: str | None = None, task_name: str | None = None):
    """task, nets (one per seed of trainer.vmap_seeds), optimizer and loop config of a config, in a process whose JAX
    is already configured; ConfigError on bad input. `head_name` None: the task's default head; the names are the
    groups' choices, for messages."""
    check(cfg)
    accelerator = construct.build("accelerator", OmegaConf.to_container(cfg.accelerator, resolve=True))
    return _assemble_checked(cfg, accelerator, head_name, normalizer_name, task_name)


def _assemble_checked(cfg: DictConfig, accelerator, head_name, normalizer_name, task_name):
    """`assemble` after `check`, on the configured machine: every group goes through `construct.build`; the given
    arguments are what follows from another group or the machine."""
    import jax
    from flax import nnx

    from attnlab.accelerator import compute_dtype
    from attnlab.config import components
    from attnlab.model import Net
    from attnlab.tasks.lengths import check_positions

    def node(group):
        return OmegaConf.to_container(cfg[group], resolve=True)

    check_devices(cfg, jax.device_count())
    # a task YAML without a _target_ is refused as its task is built, in that refusal's words
    task_class = registry.resolve_target(cfg.task["_target_"], "task") if "_target_" in cfg.task else None
    nodes = sink_statistics(task_class, {"trainer": node("trainer"), "model": node("model")})
    loop = construct.build("trainer", nodes["trainer"], read=("vmap_seeds",), seed=cfg.seed)
    make_tx = construct.build("optim", node("optim"))
    dtype = compute_dtype(accelerator.dtype)
    make_normalizer = layer_normalizer_makers(cfg, normalizer_name)
    model = nodes["model"]
    # the task, and what needs it
    task = components.task_from_node(node("task"))
    task_label = f"task={task_name or registry.name_of('task', type(task)) or type(task).__name__}"
    checks.choice("task.default_head", task.default_head, registry.choices("head"))
    head_name = head_name or task.default_head
    components.check_head_serves(head_name, task.kind, task_label)
    check_positions(task, model.get("positional"), model.get("max_len"))
    causal = _causal(model, task.granularity, make_normalizer, task_label)
    head_cfg = node("head") if cfg.get("head") else registry.load("head", head_name)
    # The sequences one device holds in a step (the batch, or the seeds, split over the devices): what the dense
    # attention form's memory grows with.
    device_batch = -(-loop.batch_size * cfg.trainer.vmap_seeds // jax.device_count())

    def make_net(seed: int) -> Net:
        rngs = nnx.Rngs(seed)
        body = construct.build(
            "model",
            {**model, "causal": causal},
            read=("layer_normalizers",),
            rngs=rngs,
            pooled=task.granularity == "sequence",
            make_normalizer=make_normalizer,
            seq_len=task.seq_len,
            vocab_size=task.vocab_size,
            input_dim=task.input_dim,
            dtype=dtype,
            batch_size=device_batch,  # the attention backend is chosen as the model is built (backends/impl.py)
            test_lengths=[at.seq_len for at in task.at_lengths.values()],
        )
        return Net(
            body, construct.build("head", head_cfg, d_model=model["d_model"], num_classes=task.num_classes, rngs=rngs)
        )

    nets = [make_net(cfg.seed + i) for i in range(cfg.trainer.vmap_seeds)]
    return task, nets, make_tx(nnx.state(nets[0], nnx.Param), total_steps=loop.steps), loop

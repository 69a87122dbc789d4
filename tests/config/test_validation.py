"""Bad inputs fail before compilation with one line naming the key, the value and what is allowed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from cli_helpers import TINY, tiny_task, train_in_process
from hydra import compose, initialize_config_dir

from attnlab.accelerator import configure
from attnlab.checks import ConfigError
from attnlab.config import registry
from attnlab.config.assembly import assemble

MQAR = tiny_task("mqar")
ICL = ["task=icl_regression"]

BAD = [
    (["model.d_model=30", "model.heads=4"], ["d_model=30", "not divisible", "heads=4"]),
    (["optim.lr=0"], ["optim.lr=0", "> 0"]),
    (["optim.lr=-1"], ["optim.lr=-1", "> 0"]),
    (["trainer.steps=0"], ["trainer.steps=0", "an integer >= 1"]),
    (["trainer.steps=-5"], ["trainer.steps=-5", "an integer >= 1"]),
    (["trainer.steps=abc"], ["trainer.steps='abc'", "an integer >= 1"]),
    (["trainer.batch_size=0"], ["trainer.batch_size=0", "an integer >= 1"]),
    (["trainer.log_every=0"], ["trainer.log_every=0", "an integer >= 1"]),
    (["trainer.eval_every=0"], ["trainer.eval_every=0", "an integer >= 1"]),
    (["trainer.nonfinite=ignore"], ["trainer.nonfinite='ignore'", "skip, stop"]),
    (["trainer.progress=fancy"], ["trainer.progress='fancy'", "auto, bar, lines, none"]),
    (["trainer.checkpoint_every=-1"], ["trainer.checkpoint_every=-1", ">= 0"]),
    (["optim.b1=1.5"], ["optim.b1=1.5", ">= 0.0 and < 1.0"]),
    (["optim.weight_decay=-0.1"], ["optim.weight_decay=-0.1", ">= 0"]),
    (["optim.clip_norm=0"], ["optim.clip_norm=0", "> 0"]),
    (["optim.warmup_steps=-1"], ["optim.warmup_steps=-1", ">= 0"]),
    (["head=mse"], ["head=mse", "classification", "scores_mse, softmax_ce"]),
    ([*ICL, "head=softmax_ce"], ["head=softmax_ce", "regression", "hlgauss, mse"]),
    (["normalizer=linear", "normalizer.feature_map=cosine"], ["feature_map='cosine'", "elu1, relu, favor"]),
    (["normalizer=linear", "normalizer.chunk_size=0"], ["chunk_size", ">= 1"]),
    (["normalizer=entmax", "normalizer.alpha=1.0"], ["alpha", "1.0", "> 1"]),
    (["normalizer=entmax", "normalizer.alpha=0.5"], ["alpha", "0.5", "> 1"]),
    (["normalizer=squared", "normalizer.eps=-1"], ["eps", "-1", ">= 0"]),
    (["normalizer=squared", "normalizer.power=0"], ["power", "0", ">= 1"]),
    (["normalizer=squared", "normalizer.offset=true", "normalizer.power=3"], ["offset", "power=3", "even"]),
    (["normalizer=kl", "normalizer.prior=gaussian"], ["prior='gaussian'", "uniform, recency, learned"]),
    (["normalizer=softmax", "normalizer.beta=-1"], ["beta", "-1", "> 0"]),
    (["model.positional=alibi"], ["positional='alibi'", "learned, sinusoidal, rope, none"]),
    (["task.seq_len=640", "task.vocab_size=1024", "model.max_len=512"], ["640", "max_len=512"]),
    (["task.num_kv_pairs=100"], ["num_kv_pairs", "100"]),
    (["model.causal=false"], ["model.causal=false", "model.causal=true or model.causal=null"]),
    (["+normalizer.temperature=2"], ["normalizer.temperature", "allowed"]),
    (["normalizer.impl=flash"], ["normalizer.impl='flash'", "auto, cudnn, xla, blockwise, dense"]),
    (["normalizer=relu", "normalizer.impl=xla"], ["normalizer.impl='xla'", "auto, blockwise, dense"]),
    (["accelerator.matmul_precision=tf32"], ["accelerator.matmul_precision='tf32'", "default, high, highest"]),
    (["accelerator.gpu_memory_fraction=0"], ["accelerator.gpu_memory_fraction=0"]),
    (
        ["accelerator.platform=gpu", "accelerator.devices=2"],
        ["accelerator.devices=2", "accelerator=cpu", "null on gpu"],
    ),
    ([*ICL, "head=hlgauss", "head.v_min=1", "head.v_max=0"], ["head.v_max=0", "> head.v_min=1"]),
    ([*ICL, "task.ridge=-1"], ["ridge", "-1"]),
]


def compose_train(overrides):
    task = next((o.split("=")[1] for o in overrides if o.startswith("task=")), "mqar")
    with initialize_config_dir(str(registry.CONFIG_DIR), version_base="1.3"):
        return compose("train", overrides=["model=tiny", f"task={task}", *tiny_task(task), *overrides])


@pytest.mark.parametrize("overrides, needles", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_input_is_refused_with_a_message_naming_it(overrides, needles):
    cfg = compose_train(overrides)
    head = next((o.split("=")[1] for o in overrides if o.startswith("head=")), cfg.task.default_head)
    with pytest.raises(ConfigError) as info:  # only ConfigError is a refusal; any other exception is a bug
        assemble(cfg, head)
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)


def test_unknown_accelerator_platform_is_refused():
    with pytest.raises(ValueError, match="accelerator.platform='quantum' is invalid; allowed: auto, cpu, gpu, tpu"):
        configure("quantum")


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["normalizer=bogus"], "normalizer=bogus unknown; allowed: differential, entmax, forgetting, kl"),
        (["model.foo=1"], "model.foo is not a key of the config; allowed in model: bias, causal, d_model"),
        (["model.heads=0"], "model.heads=0 is invalid; allowed: an integer >= 1"),
        (["trainer.resume=true"], "trainer.resume=true but"),
        (["model.d_model=30", "model.heads=4"], "not divisible"),
        (["normalizer.impl=cudnn"], "normalizer.impl=cudnn cannot run for softmax: platform cpu (cuDNN needs gpu)"),
    ],
)
def test_cli_exits_2_with_one_line_before_compiling(tmp_path, overrides, needle):
    proc = train_in_process(*TINY, *MQAR, *overrides, f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path, check=False)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.startswith("attnlab: error:")]
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "r" / "events.out.tfevents").exists()


def test_a_sweep_job_checks_its_whole_config_before_it_configures_the_machine(tmp_path):
    """A sweep's job is refused by its own run (the command line's check composes only its choices): everything the
    config answers is checked before the accelerator is configured, so the refused job never made its compile cache
    directory (attnlab.accelerator.configure makes it)."""
    cache = tmp_path / "cache"
    proc = train_in_process(
        "-m", *TINY, *MQAR, "model.heads=0", f"compile_cache={cache}", f"hydra.sweep.dir={tmp_path / 's'}",
        cwd=tmp_path, check=False,
    )  # fmt: skip
    assert "model.heads=0 is invalid; allowed: an integer >= 1" in proc.stderr, proc.stderr
    assert not cache.exists()


def test_a_refusal_imports_neither_scipy_stats_nor_scikit_learn(tmp_path):
    """A finished run's summary (scipy.stats) and task=digits (scikit-learn) import them where they use them: a
    refused command's start-up goes without (BENCHMARKS.md, start-up of a command), also one refused once jax is
    loaded (a head of the other task kind: known from the built task)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "attnlab", *TINY, *MQAR, "head=mse"],
        cwd=tmp_path,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "head=mse serves regression" in proc.stderr, proc.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert {"jax", "hydra", "attnlab.cli"} <= imported  # the refusal came after the CLI's own imports
    assert not {"scipy.stats", "sklearn"} & imported


@pytest.mark.parametrize("mode", ["run", "sweep"])
def test_output_directory_under_a_regular_file_is_one_line_and_exit_2(tmp_path, mode):
    """Tests run as root, so no permission bits: a directory below a regular file cannot be created."""
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    key = "hydra.run.dir" if mode == "run" else "hydra.sweep.dir"
    flags = [] if mode == "run" else ["-m", "seed=0,1"]
    proc = train_in_process(*flags, *TINY, *MQAR, f"{key}={blocker / 'out'}", cwd=tmp_path, check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == [
        f"attnlab: error: {key}={blocker / 'out'} cannot be created or written: {blocker} is not a "
        f"directory; allowed: a directory path you can write to"
    ], proc.stderr
    assert blocker.read_text() == "not a directory"


def test_compile_cache_under_a_regular_file_is_one_line_and_exit_2(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    proc = train_in_process(
        *TINY, *MQAR, f"compile_cache={blocker / 'cache'}", f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path, check=False
    )
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.startswith("attnlab: error:")]
    assert len(lines) == 1 and f"compile_cache={blocker / 'cache'} cannot be created" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_gpu_without_a_gpu_says_what_jax_sees_and_how_to_install(tmp_path):
    import jax

    if jax.devices()[0].platform == "gpu":
        pytest.skip("this machine has a GPU")
    proc = train_in_process(
        *[o for o in TINY if not o.startswith("accelerator=")],
        *MQAR,
        "accelerator=gpu",
        f"hydra.run.dir={tmp_path / 'r'}",
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("attnlab: error:")]
    assert len(lines) == 1, proc.stderr
    assert "accelerator=gpu asks for JAX platform 'cuda'" in lines[0] and "sees only: cpu" in lines[0]
    assert "pip install 'attnlab[cuda]'" in lines[0]
    # refused before Hydra starts a job (no CUDA plugin here), naming the command to run on a GPU machine
    assert (
        "has no gpu support installed" in lines[0] and "run it on a GPU machine: attnlab-train model=tiny" in lines[0]
    )
    assert not (tmp_path / "r").exists()


def test_sweep_command_lines_are_composed_value_by_value_before_hydra_runs():
    from attnlab.config.composition import compose_overrides

    assert compose_overrides(["seed=0,1", "normalizer=kl,softmax", "model=tiny"]) == [
        ["seed=0", "normalizer=kl", "model=tiny"],
        ["seed=1", "normalizer=kl", "model=tiny"],
        ["seed=0", "normalizer=softmax", "model=tiny"],
    ]
    # Sweeps only Hydra can expand (glob needs its config loader, interval a sweeper) are left to it.
    assert compose_overrides(["normalizer=glob(*)", "optim.lr=interval(0,1)", "seed=range(0,2)"]) == [
        ["seed=0"],
        ["seed=1"],
    ]


def test_trainer_and_optim_values_are_refused_by_their_component_without_the_cli():
    from attnlab import optim
    from attnlab.train import LoopConfig

    good = dict(steps=4, batch_size=8, eval_every=4, log_every=2, eval_batch_size=20, nonfinite="skip", seed=0)
    assert LoopConfig(**good).steps == 4
    with pytest.raises(
        ValueError, match=r"^trainer.log_every=0 is invalid; allowed: an integer >= 1 and <= 2147483647$"
    ):
        LoopConfig(**{**good, "log_every": 0})
    with pytest.raises(ValueError, match=r"^trainer.attn_map_scale='linear' is invalid; allowed: row, log, max$"):
        LoopConfig(**good, attn_map_scale="linear")
    with pytest.raises(ValueError, match=r"^optim.b2=1.0 is invalid; allowed: a finite number >= 0.0 and < 1.0$"):
        optim.make_optimizer(
            {}, lr=1e-3, warmup_steps=0, total_steps=4, weight_decay=0.0, clip_norm=1.0, b1=0.9, b2=1.0
        )


def test_matmul_precision_is_the_dtypes_rule_unless_given():
    import jax
    import jax.numpy as jnp

    from attnlab.accelerator import apply_matmul_precision, matmul_precision

    assert matmul_precision(None, jnp.float32) == "highest"  # float32 means float32, not TF32
    assert matmul_precision(None, jnp.bfloat16) == "default"
    assert matmul_precision("high", jnp.float32) == "high"
    assert apply_matmul_precision("default", jnp.float32) == "default"
    assert jax.config.jax_default_matmul_precision == "default"  # conftest's fixture restores "highest"

"""A later run of one process with the same program key runs the earlier run's compiled programs (train.programs):
the key leaves out exactly what the optimizer injects as values, those values are no constants of the update, and a
sweep's later rate computes what a run compiled on its own computes."""

import jax
import jax.numpy as jnp
import pytest
from cli_helpers import TINY, compose_train, metrics, tiny_task, train_in_process
from flax import nnx

from attnlab.config import registry
from attnlab.config.assembly import program_key
from attnlab.optim import SGD, AdamW
from attnlab.steps import make_train_step

TINY_MQAR = [*TINY, *tiny_task("mqar")]


def key(*overrides: str) -> str:
    return program_key(compose_train(*TINY_MQAR, *overrides))


def test_the_program_key_leaves_out_the_injected_options_and_keeps_every_other():
    first = key("optim.lr=1e-3")
    for values in (
        ["optim.lr=3e-2"],
        ["optim.weight_decay=0.01", "optim.b1=0.8", "optim.b2=0.95"],
        ["optim.warmup_steps=7", "optim.clip_norm=0.5", "optim.final_fraction=0.5"],
    ):
        assert key(*values) == first, values
    for other in (["seed=1"], ["model.d_model=32"], ["normalizer=kl"], ["trainer.steps=5"], ["optim=sgd"]):
        assert key("optim.lr=1e-3", *other) != first, other
    assert key("optim=sgd", "optim.momentum=0.5") != key("optim=sgd")  # SGD's momentum is a constant of its update
    assert key("optim=sgd", "optim.lr=0.3", "optim.weight_decay=0.1") == key("optim=sgd")
    assert program_key(registry.compose_train(TINY_MQAR)) == key()  # a config composed with its Hydra node


@pytest.mark.parametrize("make", [lambda **v: AdamW(**v), lambda **v: SGD(**v, momentum=0.9)], ids=["adamw", "sgd"])
def test_the_injected_options_are_arrays_of_the_optimizer_state_not_constants_of_the_update(make):
    """Two optimizers differing in every injected option: the same update program (jaxpr), its state's
    hyperparameters the injected options and the run's length."""
    params = nnx.State({"w": nnx.Param(jnp.ones((3, 2))), "b": nnx.Param(jnp.ones((2,)))})
    grads = jax.tree.map(lambda p: 0.1 * p, params)
    one = make(lr=1e-3, warmup_steps=2, clip_norm=1.0, final_fraction=0.1, weight_decay=0.1)
    other = make(lr=3e-2, warmup_steps=5, clip_norm=0.3, final_fraction=0.5, weight_decay=0.0)

    def program(opt):
        tx = opt(params, total_steps=10)
        return str(jax.make_jaxpr(lambda g, s, p: tx.update(g, s, p))(grads, tx.init(params), params))

    assert program(one) == program(other)
    assert set(one(params, 10).init(params).hyperparams) == {*one.injected(), "total_steps"}


def test_a_later_rate_of_a_sweep_runs_the_first_rates_programs_and_computes_what_its_own_would(tmp_path, monkeypatch):
    from attnlab.train import loop, programs

    built = []
    monkeypatch.setattr(loop, "make_train_step", lambda *a, **k: built.append(1) or make_train_step(*a, **k))
    train_in_process("-m", "optim.lr=1e-3,1e-2", *TINY_MQAR, f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    assert len(built) == 1  # the second job built no train step: it ran the first's
    programs.clear()
    train_in_process("optim.lr=1e-2", *TINY_MQAR, f"hydra.run.dir={tmp_path / 'alone'}", cwd=tmp_path)
    assert len(built) == 2
    later, alone = metrics(tmp_path / "sweep" / "1_optim.lr=0.01"), metrics(tmp_path / "alone")
    assert later["final"] == alone["final"] and later["best"] == alone["best"]
    assert later["final"] != metrics(tmp_path / "sweep" / "0_optim.lr=0.001")["final"]  # the rate reached the program

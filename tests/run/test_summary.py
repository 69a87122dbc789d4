"""What a newcomer sees on the first run: no backend-probing noise, a val curve, a summary that says what ran."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from cli_helpers import CACHE, TINY, metrics, scalar_curve, tiny_task, train_in_process

from attnlab import config
from attnlab.train import LoopConfig


@pytest.mark.long  # ~20 s: a process of its own that lets JAX look for every platform
def test_no_backend_probing_line_on_the_console_or_in_the_log(tmp_path):
    """accelerator=auto with no JAX_PLATFORMS: JAX probes for a TPU and logs 'Unable to initialize backend' at INFO."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"} | {"HYDRA_FULL_ERROR": "0"}
    run_dir = tmp_path / "r"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnlab",
            "model=tiny",
            "accelerator=auto",
            "trainer.steps=2",
            "trainer.progress=none",
            f"compile_cache={CACHE}",
            *tiny_task("mqar"),
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    logs = "".join(p.read_text() for p in run_dir.glob("*.log"))
    for text in (proc.stdout, proc.stderr, logs):
        assert "Unable to initialize backend" not in text and "xla_bridge" not in text, text


def test_logged_lr_is_the_applied_schedule_with_its_final_fraction(tmp_path):
    """opt/lr at logged step s is the rate of update s: warmup then cosine to final_fraction·lr (closed form)."""
    lr, warmup, steps, final = 1e-3, 2, 8, 0.5
    keep = [o for o in TINY if not o.startswith(("trainer.steps=", "trainer.log_every=", "trainer.eval_every="))]
    run_dir = tmp_path / "r"
    train_in_process(
        *keep,
        *tiny_task("mqar"),
        f"trainer.steps={steps}",
        "trainer.log_every=1",
        f"trainer.eval_every={steps}",
        f"optim.lr={lr}",
        f"optim.warmup_steps={warmup}",
        f"optim.final_fraction={final}",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
    )
    logged = dict(scalar_curve(run_dir, "opt/lr"))
    count = np.arange(steps)  # the optimizer's count when update s = count + 1 was applied
    cosine = final * lr + (1 - final) * lr * 0.5 * (1 + np.cos(np.pi * (count - warmup) / (steps - warmup)))
    expected = np.where(count < warmup, lr * count / warmup, cosine)
    np.testing.assert_allclose([logged[s] for s in range(1, steps + 1)], expected, rtol=1e-5, atol=1e-12)


@pytest.mark.parametrize("steps, every", [(8, 2), (150, 37), (800, 200), (3000, 200), (2, 1)])
def test_auto_eval_every_gives_short_runs_a_val_curve(steps, every):
    cfg = LoopConfig(
        steps=steps, batch_size=8, eval_every=None, log_every=1, eval_batch_size=8, nonfinite="skip", seed=0
    )
    assert cfg.eval_every == every
    assert LoopConfig(**{**cfg.__dict__, "eval_every": "auto"}).eval_every == every


def test_eval_every_above_steps_warns_in_one_line(tmp_path):
    keep = [o for o in TINY if not o.startswith(("trainer.steps=", "trainer.eval_every="))]
    proc = train_in_process(
        *keep,
        *tiny_task("mqar"),
        "trainer.steps=6",
        "trainer.eval_every=200",
        f"hydra.run.dir={tmp_path / 'r'}",
        cwd=tmp_path,
    )
    warned = [line for line in proc.stderr.splitlines() if "trainer.eval_every=200 > trainer.steps=6" in line]
    assert len(warned) == 1 and warned[0].startswith("attnlab: warning:"), proc.stderr


def test_a_short_run_with_the_default_has_a_val_curve(tmp_path):
    keep = [o for o in TINY if not o.startswith(("trainer.steps=", "trainer.eval_every="))]
    train_in_process(*keep, *tiny_task("mqar"), "trainer.steps=8", f"hydra.run.dir={tmp_path / 'r'}", cwd=tmp_path)
    assert [s for s, _ in scalar_curve(tmp_path / "r", "val/loss")] == [2, 4, 6, 8]


def test_summary_leads_with_what_ran_and_the_headline_against_its_baselines(tmp_path):
    keep = [o for o in TINY if not o.startswith("model=")]
    run_dir = tmp_path / "r"
    proc = train_in_process(
        *keep, "model=tiny", "task=lm", *tiny_task("lm"), "normalizer=linear", f"hydra.run.dir={run_dir}", cwd=tmp_path
    )
    m = metrics(run_dir)
    lines = proc.stdout.splitlines()
    assert lines[0] == "ran: normalizer=linear task=lm head=softmax_ce model=tiny steps=4/4 device=cpu×1", lines
    b = m["baseline"]
    assert lines[1] == (
        f"headline: test/bits_per_byte {m['final']['test/bits_per_byte']:.4g} (baselines: unigram "
        f"{b['baseline/bits_per_byte']:.4g}, bigram {b['baseline/bits_per_byte_bigram']:.4g})"
    ), lines


def test_attention_statistic_tags_carry_their_definition(tmp_path):
    """TensorBoard's own (plugin) reader finds the description on the tags: entropy is H / log n."""
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator

    from attnlab.board.summaries import Summaries

    s = Summaries(str(tmp_path))
    s.scalars(1, {"attn_entropy/layer_0": 0.5, "attn_entropy/layer_0/head_1": 0.4, "val/accuracy": 0.1})
    s.scalars(2, {"attn_entropy/layer_0": 0.3})
    s.close()
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    for tag in ("attn_entropy/layer_0", "attn_entropy/layer_0/head_1"):
        assert "H / log n" in acc.SummaryMetadata(tag).summary_description
    assert [e.step for e in acc.Tensors("attn_entropy/layer_0")] == [1, 2]
    assert acc.SummaryMetadata("val/accuracy").summary_description == ""


def test_short_lm_attention_maps_are_labelled_with_the_shown_characters():
    from attnlab.board import images as tb_images

    lm = config.task("lm", seq_len=16, n_train=50, n_val=10, n_test=10)
    text = "to be\nor not"
    tokens = np.frombuffer(text.encode(), np.uint8).astype(np.int32) + 1  # the lm's inputs are byte + 1
    labels = tb_images.char_labels(lm, tokens)
    assert labels == ["t", "o", "␣", "b", "e", "↵", "o", "r", "␣", "n", "o", "t"]
    fig = tb_images.render(np.full((2, len(text), len(text)), 1 / len(text)), "row", "t", labels=labels)
    for ax in fig.axes[:2]:  # both head panels, both axes
        assert [t.get_text() for t in ax.get_xticklabels()] == labels == [t.get_text() for t in ax.get_yticklabels()]
    assert tb_images.char_labels(lm, np.ones(tb_images.MAX_LABELLED + 1, np.int32)) is None  # long: positions
    assert tb_images.char_labels(config.task("digits"), tokens) is None  # a task without text


@pytest.mark.parametrize("seq_len", [16, 272])
def test_the_continuation_is_the_models_greedy_choice_after_the_prompt(seq_len):
    """Teacher-forced check on the full-length window: each written byte is the argmax of the logits before it,
    also past continuation.MAX_CONTEXT, where the sample runs on the shown example's prefix (the model is causal)."""
    import jax
    from cli_helpers import compose_train
    from flax import nnx

    from attnlab.config.assembly import assemble
    from attnlab.tasks.lm.continuation import make_continuation, prompt_length, sample_length

    cfg = compose_train("model=tiny", "task=lm", *tiny_task("lm"), f"task.seq_len={seq_len}", "model.max_len=512")
    task, nets, _, _ = assemble(cfg, "softmax_ce")
    graphdef, params, rest = nnx.split(nets[0], nnx.Param, ...)
    inputs, valid = task.splits["val"].inputs[:1], task.splits["val"].valid[:1]
    written = np.asarray(jax.jit(make_continuation(graphdef, seq_len=seq_len))(params, rest, inputs, valid))
    length = sample_length(seq_len)
    start = prompt_length(length)
    assert written.shape == (1, min(seq_len, 256)) and start == {16: 8, 272: 192}[seq_len]
    assert (written[0, :start] == inputs[0, :start]).all()
    full = inputs.copy()
    full[0, :length] = written[0]
    logits = np.asarray(nets[0].head(nets[0].body(full, valid)[0]))[0]
    np.testing.assert_array_equal(written[0, start:], logits[start - 1 : length - 1].argmax(-1) + 1)


def test_lm_logs_a_continuation_of_the_shown_example_at_each_eval(tmp_path):
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator

    run_dir = tmp_path / "r"
    train_in_process(
        *TINY, "task=lm", *tiny_task("lm"), "trainer.eval_every=2", f"hydra.run.dir={run_dir}", cwd=tmp_path
    )
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    events = acc.Tensors("sample/continuation/text_summary")
    assert [e.step for e in events] == [2, 4]
    shown = acc.Tensors("example/text/text_summary")[0].tensor_proto.string_val[0].decode()
    text = events[-1].tensor_proto.string_val[0].decode()
    assert text.startswith("prompt ▶ greedy continuation (") and "▶" in text.split("\n\n", 1)[1]
    block = "\n".join(line[4:] for line in text.split("\n\n", 1)[1].split("\n"))
    assert block.split("▶")[0] == shown[: len(block.split("▶")[0])] and len(block.split("▶")[0]) >= 1


def test_loss_and_headline_curves_are_the_first_time_series_group(tmp_path):
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator

    from attnlab.board.summaries import MAIN, Summaries

    s = Summaries(str(tmp_path))
    s.layout(1, "bits_per_byte")
    for step in (1, 2):
        s.scalars(
            step,
            {
                "train/loss": 3.0 / step,
                "attn_beta/layer_0": 1.0,
                "val/bits_per_byte": 4.0 / step,
                "val/accuracy": 0.1 * step,
            },
        )
    s.close()
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    tags = acc.Tags()["tensors"]
    groups = sorted({t.split("/")[0] for t in tags if t != "custom_scalars__config__"})
    assert groups[0] == MAIN and {t for t in tags if t.startswith(MAIN)} == {
        f"{MAIN}/train_loss",
        f"{MAIN}/val_bits_per_byte",
    }
    for copy, tag in ((f"{MAIN}/train_loss", "train/loss"), (f"{MAIN}/val_bits_per_byte", "val/bits_per_byte")):
        got = [(e.step, float(e.tensor_proto.float_val[0])) for e in acc.Tensors(copy)]
        assert got == [(e.step, float(e.tensor_proto.float_val[0])) for e in acc.Tensors(tag)] and len(got) == 2
